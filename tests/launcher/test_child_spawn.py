"""launcher/child.py: the training command started as subprocess.Popen would start it, without subprocess.

Each test starts real processes and compares with what Popen does where the two could differ: where PATH is read
from, the errors, the signals a command inherits, the descriptors it inherits, its process group and output.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from trainhook.launcher.child import spawn
from trainhook.launcher.process import returncode, wait_for


def finished(child) -> int:
    child.returncode = returncode(wait_for(child.pid, reap_all=False))
    return child.returncode


def script(directory, name: str, body: str, mode: int = 0o755):
    path = directory / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(mode)
    return path


def read_all(fd: int) -> str:
    chunks = []
    while True:
        data = os.read(fd, 65536)
        if not data:
            os.close(fd)
            return b"".join(chunks).decode()
        chunks.append(data)


def test_path_is_searched_in_the_commands_environment_as_popen_does(tmp_path, monkeypatch):
    script(tmp_path, "only-in-its-path", "exit 7")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # the launcher's own PATH does not hold it
    env = {"PATH": f"/nonexistent:{tmp_path}"}
    assert finished(spawn(["only-in-its-path"], env)) == 7
    assert subprocess.run(["only-in-its-path"], env=env).returncode == 7
    with pytest.raises(FileNotFoundError):
        spawn(["only-in-its-path"], {"PATH": "/usr/bin:/bin"})


def test_the_errors_are_popens(tmp_path):
    script(tmp_path, "not-executable", "exit 0", mode=0o644)
    env = {"PATH": str(tmp_path)}
    for argv in (["no-such-command"], ["not-executable"], [str(tmp_path)], [str(tmp_path / "absent")]):
        with pytest.raises(OSError) as ours:
            spawn(argv, env)
        with pytest.raises(OSError) as popens:
            subprocess.Popen(argv, env=env)
        assert type(ours.value) is type(popens.value), argv
        assert ours.value.errno == popens.value.errno, argv


def test_a_bad_interpreter_line_is_an_error_not_a_child(tmp_path):
    broken = tmp_path / "broken"
    broken.write_text("#!/no/such/interpreter\n")
    broken.chmod(0o755)
    with pytest.raises(FileNotFoundError):
        spawn([str(broken)], {"PATH": "/usr/bin:/bin"})


def test_signals_python_ignores_are_back_to_their_defaults(tmp_path):
    assert signal.getsignal(signal.SIGPIPE) == signal.SIG_IGN  # what this Python (and a launcher) has
    child = spawn(["sleep", "30"], {"PATH": "/usr/bin:/bin"})
    try:
        ignored = 0
        for _ in range(100):  # until it has exec'd sleep (the mask is the exec'd program's)
            status = open(f"/proc/{child.pid}/status").read()
            if "sleep" in status.splitlines()[0]:
                ignored = int(next(line for line in status.splitlines() if line.startswith("SigIgn:")).split()[1], 16)
                break
            time.sleep(0.02)
        else:
            raise AssertionError("the child never became sleep")
        assert not ignored & (1 << (signal.SIGPIPE - 1)) and not ignored & (1 << (signal.SIGXFSZ - 1))
    finally:
        os.kill(child.pid, signal.SIGKILL)
        finished(child)


def test_no_descriptor_but_0_1_2_and_its_own_output_is_inherited(tmp_path):
    stray_read, stray_write = os.pipe()
    os.set_inheritable(stray_write, True)  # as one a container's runtime could hand the launcher
    out_read, out_write = os.pipe()
    try:
        child = spawn(["sh", "-c", "ls /proc/$$/fd"], {"PATH": "/usr/bin:/bin"}, stdout=out_write)
        os.close(out_write)
        out_write = -1
        listed = sorted(int(fd) for fd in read_all(out_read).split())
        assert finished(child) == 0
        assert stray_write not in listed and {0, 1, 2} <= set(listed)
    finally:
        for fd in (stray_read, stray_write, out_write):
            if fd >= 0:
                os.close(fd)


def test_its_own_group_and_its_output_where_asked(tmp_path):
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    child = spawn([sys.executable, "-c", "import os, sys; print(os.getpgid(0)); print('e', file=sys.stderr)"],
                  {"PATH": "/usr/bin:/bin"}, stdout=out_write, stderr=err_write, own_group=True)
    os.close(out_write)
    os.close(err_write)
    assert read_all(out_read).strip() == str(child.pid) and read_all(err_read).strip() == "e"
    assert finished(child) == 0
    together = spawn(["sh", "-c", 'test "$(ps -o pgid= -p $$)" -eq "$0"', str(os.getpgid(0))], None)
    assert finished(together) == 0  # without own_group: in the launcher's group, as Popen leaves it
