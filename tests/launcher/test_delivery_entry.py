"""The delivered entry point, /trainhook/bin/trainhook-launch (launcher/entry/trainhook-launch.c), run as real
processes: a static program that needs nothing from the image but a Python on PATH, finds it as the shell script
it replaces did (python3 first, then python, the first executable file in PATH order), and execs `PYTHON -I
DIR/launcher.pyz ARGS` so that the arguments, the exit code and the signals are the Python's own.

It is compiled here with this machine's C compiler, exactly as launcher/deliver.py compiles it where the images'
prebuilt one is absent (the images build it with musl-gcc and the same flags: tests/repo/test_images.py). A shell-less
image is proven on the real node (tests/e2e/test_e2e_shellless.py); here the program runs with a PATH holding
nothing but what each test puts there.
"""

from __future__ import annotations

import json
import shutil
import signal
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from trainhook.launcher import deliver

NO_PYTHON = f"trainhook-launch: no python3 or python on PATH in this image; {deliver.FIX}\n"
# A stand-in for launcher.pyz: reports what it was given, then exits or kills itself as asked. It waits in short
# sleeps: a signal landing between "ready" and one long sleep's system call would wait out the sleep (Python runs
# handlers between bytecodes).
PROBE = """import json, os, signal, sys, time
if os.environ.get("PROBE_WAIT"):
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(42))
    print("ready", flush=True)
    for _ in range(600):
        time.sleep(0.1)
print(json.dumps({"argv": sys.argv, "pid": os.getpid(), "isolated": sys.flags.isolated,
                  "no_site": sys.flags.no_site, "site_imported": "site" in sys.modules,
                  "executable": sys.executable}))
if os.environ.get("PROBE_SIGNAL"):
    os.kill(os.getpid(), int(os.environ["PROBE_SIGNAL"]))
sys.exit(int(os.environ.get("PROBE_EXIT", "0")))
"""


def compiler() -> str:
    found = next((shutil.which(c) for c in deliver.COMPILERS if shutil.which(c)), None)
    if found is None:
        pytest.fail(f"no C compiler ({', '.join(deliver.COMPILERS)}): install gcc and libc6-dev (.ci/run and "
                    "hack/k8s-build.sh need them too)")
    return found


def is_static(program: Path) -> bool:
    """An ELF file with no PT_INTERP program header: the kernel runs it without any dynamic loader or library."""
    data = program.read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2, "not a 64-bit ELF file"
    phoff = struct.unpack_from("<Q", data, 0x20)[0]
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    return all(struct.unpack_from("<I", data, phoff + i * phentsize)[0] != 3 for i in range(phnum))


@pytest.fixture(scope="module")
def delivered(tmp_path_factory) -> Path:
    """DIR/bin/trainhook-launch (compiled here) beside a probe DIR/launcher.pyz."""
    directory = tmp_path_factory.mktemp("delivered")
    (directory / "bin").mkdir()
    program = deliver.compile_entry(directory / "bin" / "trainhook-launch", compiler())
    with zipfile.ZipFile(directory / "launcher.pyz", "w") as archive:
        archive.writestr("__main__.py", PROBE)
    return program


def python_dir(tmp_path: Path, *names: str) -> Path:
    """A directory holding this Python under `names`, as an image's bin directory would."""
    directory = tmp_path / "image-bin"
    directory.mkdir(exist_ok=True)
    for name in names:
        (directory / name).symlink_to(sys.executable)
    return directory


def launch(program: Path, *args: str, path: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(program), *args], env={"PATH": path, **env}, capture_output=True, text=True,
                          timeout=60, cwd="/")


def probe(done: subprocess.CompletedProcess) -> dict:
    assert done.stderr == "", done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_the_entry_point_is_a_static_program_that_delivery_uses(delivered, tmp_path):
    assert is_static(delivered)
    assert delivered.stat().st_size < 1_000_000  # beside the zip in a ConfigMap of 1 MiB at most
    assert deliver.is_program(deliver.entry_program())
    deliver.install(tmp_path)
    assert deliver.is_program((tmp_path / "bin" / "trainhook-launch").read_bytes())


def test_with_no_python_on_path_it_prints_the_one_line_fix_and_exits_127(delivered, tmp_path):
    (tmp_path / "python3").mkdir()  # neither a directory nor a file without x counts as a Python
    (tmp_path / "python").write_text("#!/bin/sh\n")
    done = launch(delivered, "run", "--", "true", path=f"{tmp_path}::/nonexistent")
    assert (done.returncode, done.stdout, done.stderr) == (127, "", NO_PYTHON)


def test_its_message_is_the_shell_scripts_word_for_word(delivered, tmp_path):
    """Where no compiler gave the program, the script SHIM stands in: both say the same thing."""
    shim = tmp_path / "trainhook-launch"
    shim.write_text(deliver.SHIM)
    by_shell = subprocess.run(["/bin/sh", str(shim)], env={"PATH": str(tmp_path)}, capture_output=True, text=True)
    assert (by_shell.returncode, by_shell.stderr) == (127, NO_PYTHON)


def test_it_execs_python3_isolated_without_site_on_the_zip_beside_it_with_every_argument_verbatim(delivered, tmp_path):
    bin_dir = python_dir(tmp_path, "python3", "python")
    words = ["run", "--", "python", "-c", "print(1)", "a b", "'single'", '"double"', "", "$HOME", "*", "x\ny",
             "--", "-I", "ünïcode", "back\\slash"]
    process = subprocess.Popen([str(delivered), *words], env={"PATH": str(bin_dir)}, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, cwd="/")
    out, err = process.communicate(timeout=60)
    seen = probe(subprocess.CompletedProcess([], process.returncode, out, err))
    assert process.returncode == 0
    assert seen["argv"] == [str(delivered.parent.parent / "launcher.pyz"), *words]
    assert seen["isolated"] == 1 and seen["executable"] == str(bin_dir / "python3")
    assert seen["no_site"] == 1 and not seen["site_imported"]  # ~3 ms of a start: the launcher needs none of it
    assert seen["pid"] == process.pid  # exec: no process of ours stays between the kubelet and Python


def test_python_is_the_fallback_and_path_order_decides(delivered, tmp_path):
    only_python = python_dir(tmp_path, "python")
    assert probe(launch(delivered, "x", path=f"/nonexistent:{only_python}"))["executable"] == \
        str(only_python / "python")
    first, second = tmp_path / "first", tmp_path / "second"
    for directory in (first, second):
        directory.mkdir()
        (directory / "python3").symlink_to(sys.executable)
    (tmp_path / "no-x").mkdir()
    (tmp_path / "no-x" / "python3").write_text("not runnable")
    seen = probe(launch(delivered, "x", path=f"{tmp_path / 'no-x'}:{only_python}:{first}:{second}"))
    assert seen["executable"] == str(first / "python3")  # python3 anywhere on PATH before python


@pytest.mark.parametrize("code", [0, 1, 3, 127, 255])
def test_the_exit_code_is_pythons(delivered, tmp_path, code):
    bin_dir = python_dir(tmp_path, "python3")
    assert launch(delivered, path=str(bin_dir), PROBE_EXIT=str(code)).returncode == code


def test_a_signal_that_kills_python_is_the_processs_own_death(delivered, tmp_path):
    bin_dir = python_dir(tmp_path, "python3")
    assert launch(delivered, path=str(bin_dir), PROBE_SIGNAL=str(int(signal.SIGKILL))).returncode == -signal.SIGKILL


def test_a_signal_sent_to_the_container_reaches_pythons_handler(delivered, tmp_path):
    """The kubelet stops a container with SIGTERM to its first process: that is Python itself."""
    bin_dir = python_dir(tmp_path, "python3")
    process = subprocess.Popen([str(delivered)], env={"PATH": str(bin_dir), "PROBE_WAIT": "1"},
                               stdout=subprocess.PIPE, text=True, cwd="/")
    try:
        assert process.stdout.readline() == "ready\n"
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 42
    finally:
        process.kill()
        process.wait()


def test_an_old_python_is_told_the_fix_by_the_zips_first_lines(tmp_path):
    """The real launcher, installed as the init container installs it, under a `python3` that says it is 3.7."""
    deliver.install(tmp_path / "trainhook")
    bin_dir = tmp_path / "old-bin"
    bin_dir.mkdir()
    old = bin_dir / "python3"
    old.write_text(f"#!{sys.executable}\nimport runpy, sys\nsys.version_info = (3, 7, 9)\n"
                   "assert sys.argv[1:3] == ['-I', '-S']\nsys.argv = sys.argv[3:]\n"
                   "runpy.run_path(sys.argv[0], run_name='__main__')\n")
    old.chmod(0o755)
    done = launch(tmp_path / "trainhook" / "bin" / "trainhook-launch", "run", "--", "true", path=str(bin_dir))
    assert (done.returncode, done.stderr) == (127, f"trainhook-launch: this image's Python is 3.7; {deliver.FIX}\n")


def test_a_python_that_cannot_be_run_is_named(delivered, tmp_path):
    broken = tmp_path / "python3"
    broken.write_text("#!/nonexistent/interpreter\n")
    broken.chmod(0o755)
    done = launch(delivered, "run", path=str(tmp_path))
    assert done.returncode == 127
    assert done.stderr == f"trainhook-launch: cannot run {broken}: no such file (a broken interpreter line?)\n"


def test_the_zip_is_found_through_the_configmaps_symlinks_and_when_started_by_name(delivered, tmp_path):
    """The kubelet lays a ConfigMap out as DIR/bin -> ..data/bin; a user may also put DIR/bin on PATH."""
    data = tmp_path / "volume" / "..data"
    (data / "bin").mkdir(parents=True)
    shutil.copy2(delivered, data / "bin" / "trainhook-launch")
    shutil.copy2(delivered.parent.parent / "launcher.pyz", data / "launcher.pyz")
    (tmp_path / "volume" / "bin").symlink_to("..data/bin")
    (tmp_path / "volume" / "launcher.pyz").symlink_to("..data/launcher.pyz")
    bin_dir = python_dir(tmp_path, "python3")
    seen = probe(launch(tmp_path / "volume" / "bin" / "trainhook-launch", path=str(bin_dir)))
    assert seen["argv"] == [str(tmp_path / "volume" / "launcher.pyz")]
    by_name = subprocess.run(["trainhook-launch", "a"], env={"PATH": f"{bin_dir}:{data / 'bin'}"},
                             capture_output=True, text=True, timeout=60, cwd="/",
                             executable=str(data / "bin" / "trainhook-launch"))
    assert probe(by_name)["argv"] == [str(data / "launcher.pyz"), "a"]
