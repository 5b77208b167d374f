"""The delivered zip carries bytecode for the modules a gang's start imports (launcher/deliver.py, issue 26), and
what that promises, with real processes: the image's Python with the builder's magic number runs the .pyc (the
sources are never compiled: they can be anything), a Python with another one runs the sources as before, the same
modules give the same bytes in any process (every webhook replica names the same ConfigMap), the zip still fits a
ConfigMap beside the entry program, and a member's start imports only modules that have bytecode and nothing that
only rank 0 (the coordinator) or another command needs, nor the standard library issue 32 took off its start."""

from __future__ import annotations

import ast
import glob
import importlib.util
import io
import marshal
import os
import re
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from gang_notary import GangNotary, indexed_job
from trainhook.launcher import deliver
from trainhook.webhook import launcher_configmap as lcm
from webhook_process import free_port

ZIP = deliver.build_zip()
PYTHON38 = sorted(glob.glob("/root/.pyenv/versions/3.8*/bin/python"))
MAGIC_38 = (3413).to_bytes(2, "little") + b"\r\n"


def entries(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def rezip(contents: dict[str, bytes], path: Path) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in contents.items():
            archive.writestr(name, data)
    return path


def launch(python: str, launcher: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-I", str(launcher), *args], capture_output=True, text=True, timeout=60,
                          env={"PATH": os.environ["PATH"]})


def test_the_bytecode_is_what_runs_under_the_builders_python(tmp_path):
    """Every source that has a .pyc is replaced by one that fails loudly: the launcher still runs a command."""
    contents = entries(ZIP)
    compiled = [name[:-1] for name in contents if name.endswith(".pyc")]
    assert {"__main__.py", "trainhook/launcher/cli.py", "trainhook/launcher/run.py",
            "trainhook/launcher/coordination/member_run.py", "trainhook/launcher/notary_client.py"} <= set(compiled)
    for name in compiled:
        contents[name] = b"raise SystemExit('the source of " + name.encode() + b" was compiled')\n"
    launcher = rezip(contents, tmp_path / "launcher.pyz")
    done = launch(sys.executable, launcher, "run", "--", "sh", "-c", "echo from the image; exit 3")
    assert (done.returncode, done.stdout, done.stderr) == (3, "from the image\n", "")
    header = entries(ZIP)["trainhook/launcher/run.pyc"][:16]
    source = entries(ZIP)["trainhook/launcher/run.py"]
    assert header == importlib.util.MAGIC_NUMBER + b"\x01\0\0\0" + importlib.util.source_hash(source)


def test_a_python_with_another_magic_number_compiles_the_sources(tmp_path):
    """The .pyc carry another version's magic number and code that would exit 99: the sources run instead."""
    contents = entries(ZIP)
    for name in [n for n in contents if n.endswith(".pyc")]:
        contents[name] = MAGIC_38 + contents[name][4:16] + marshal.dumps(compile("raise SystemExit(99)", name, "exec"))
    launcher = rezip(contents, tmp_path / "launcher.pyz")
    done = launch(sys.executable, launcher, "run", "--", "sh", "-c", "echo sources; exit 3")
    assert (done.returncode, done.stdout, done.stderr) == (3, "sources\n", "")  # not 99: no .pyc was run


@pytest.mark.parametrize("stored", [True, False], ids=["bytecode-stored", "bytecode-deflated"])
@pytest.mark.parametrize("python", PYTHON38[:1] + [sys.executable])  # as tests/launcher/test_launcher_boundary.py
def test_python_38_and_this_one_run_the_zip_as_built(tmp_path, python, stored):
    launcher = tmp_path / "launcher.pyz"
    launcher.write_bytes(deliver.build_zip(stored=stored))
    done = launch(python, launcher, "run", "--", "sh", "-c", "echo old; exit 4")
    assert (done.returncode, done.stdout) == (4, "old\n"), done.stderr


def test_the_same_modules_give_the_same_bytes_in_any_process():
    """In a fresh process, and here, where the launcher's modules (and the webhook's) are imported already: the
    ConfigMap's name is the content's hash, so the webhook's replicas must agree on it."""
    import trainhook.launcher.coordination.member_run  # noqa: F401  (the modules' own code objects alive in this process)
    import trainhook.launcher.mpi.launch  # noqa: F401
    here = deliver.build_zip()
    fresh = subprocess.run([sys.executable, "-c", "import sys; from trainhook.launcher import deliver; "
                            "sys.stdout.buffer.write(deliver.build_zip())"], capture_output=True, timeout=120)
    assert fresh.returncode == 0, fresh.stderr
    assert fresh.stdout == here == deliver.build_zip()


def compress_types(data: bytes) -> dict[str, set[int]]:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        kinds: dict[str, set[int]] = {".pyc": set(), ".py": set()}
        for info in archive.infolist():
            kinds[os.path.splitext(info.filename)[1]].add(info.compress_type)
    return kinds


def test_the_zip_fits_a_configmap_beside_the_entry_program(monkeypatch):
    """The bytecode is stored (no inflating at each start) where it fits beside the entry program in a ConfigMap,
    deflated where it does not (a glibc static program); the sources are deflated either way."""
    sources = deliver.build_zip(bytecode_too=False)
    stored, deflated = deliver.build_zip(stored=True), deliver.build_zip(stored=False)
    assert compress_types(stored) == {".pyc": {zipfile.ZIP_STORED}, ".py": {zipfile.ZIP_DEFLATED}}
    assert compress_types(deflated) == {".pyc": {zipfile.ZIP_DEFLATED}, ".py": {zipfile.ZIP_DEFLATED}}
    assert entries(stored) == entries(deflated)
    assert len(ZIP) + len(deliver.entry_program()) < lcm.MAX_BYTES
    assert len(deflated) < 350_000  # beside the largest entry program (glibc's, 683 KB) with room to spare
    assert len(deflated) < 2.5 * len(sources)
    assert len(stored) < 800_000  # beside musl's 20 KB program (the images') with room to spare
    for entry, chosen in ((b"\x7fELF" + bytes(20_000), stored), (b"\x7fELF" + bytes(683_000), deflated),
                          (deliver.SHIM.encode(), stored)):
        monkeypatch.setattr(deliver, "entry_program", lambda entry=entry: entry)
        assert deliver.build_zip() == chosen


def imports_until(launcher: Path, env: dict[str, str], marker: str) -> set[str]:
    """The modules a `run` start imports up to its line holding `marker` (then it is killed), started as the
    entry program starts it (`-I -S`: test_delivery_entry.py)."""
    proc = subprocess.Popen([sys.executable, "-X", "importtime", "-I", "-S", str(launcher), "run", "--", "true"],
                            env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen, lines = set(), []
    try:
        for line in proc.stderr:
            lines.append(line)
            found = re.match(r"import time:\s+\d+ \|\s+\d+ \| *(\S+)", line)
            if found:
                seen.add(found.group(1))
            elif marker in line:
                return seen
        raise AssertionError(f"no {marker!r} from the launcher:\n{''.join(lines)[-3000:]}")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stderr.close()


def test_a_members_start_imports_only_modules_with_bytecode_and_not_the_coordinators(tmp_path):
    launcher = tmp_path / "launcher.pyz"
    launcher.write_bytes(ZIP)
    compiled = {name[:-4].replace("/__init__", "").replace("/", ".") for name in entries(ZIP) if name.endswith(".pyc")}
    with GangNotary(tmp_path / "run") as notary:
        pods = notary.admit(indexed_job("g", "team-a", completions=3, command=["true"]))
        env = {**notary.env(pods[1]), "PATH": "/usr/bin:/bin", "TRAINHOOK_COORDINATOR_PORT": str(free_port())}
        member = imports_until(launcher, env, "cannot reach the gang's coordinator")
        env = {**notary.env(pods[0]), "PATH": "/usr/bin:/bin", "TRAINHOOK_COORDINATOR_PORT": str(free_port())}
        rank0 = imports_until(launcher, env, "joined the gang's coordinator")
    ours = {m for m in member | rank0 if m.startswith("trainhook")}
    assert "trainhook.launcher.coordination.member_run" in ours and ours <= compiled, ours - compiled
    only_rank0 = {"trainhook.launcher.coordination.coordinator", "trainhook.launcher.coordination.elastic", "trainhook.launcher.coordination.pending"}
    assert only_rank0 <= rank0 and not only_rank0 & member
    assert not {"trainhook.launcher.wait.command", "argparse"} & (member | rank0)  # the init container's; no parsing
    # What issue 32 took off every start: http.client (notary_client), dataclasses with its inspect (plain classes),
    # the idna codec (the notary's host name as bytes), datetime (outcome.now_rfc3339), typing (~4 ms: every module a
    # start imports, trainhook/__init__.py included, imports its names for annotations only), tempfile and shutil
    # (with bz2 and lzma: files.private_directory and remove_tree, ~3 ms), subprocess with its locale (~2.5 ms: the
    # training is started by launcher/child.py's posix_spawn), random and secrets (~0.6 ms: reach.draw, os.urandom).
    assert not {"http.client", "dataclasses", "inspect", "encodings.idna", "datetime", "typing", "tempfile",
                "shutil", "bz2", "lzma", "subprocess", "locale", "random", "secrets"} & (member | rank0)
    sources = entries(ZIP)
    loads = {}
    for module in ours:
        path = module.replace(".", "/")
        loads[module] = typing_at_run_time(sources.get(f"{path}.py") or sources[f"{path}/__init__.py"])
    assert {module: lines for module, lines in loads.items() if lines} == {}




def typing_at_run_time(source: bytes) -> list[int]:
    """The lines of a module that import typing outside `if TYPE_CHECKING:` (with TYPE_CHECKING its own False)."""
    tree = ast.parse(source)
    guarded = {id(inner) for node in ast.walk(tree) if isinstance(node, ast.If)
               and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
               for statement in node.body for inner in ast.walk(statement)}
    assert not guarded or b"\nTYPE_CHECKING = False" in source, "TYPE_CHECKING imported from typing"
    return [node.lineno for node in ast.walk(tree) if id(node) not in guarded and (
        (isinstance(node, ast.Import) and any(alias.name == "typing" for alias in node.names))
        or (isinstance(node, ast.ImportFrom) and node.module == "typing"))]

def test_the_zip_does_not_depend_on_what_the_building_process_interned():
    # Seen in CI: a long test session built other bytes than a fresh process (the one-character string '?' had
    # been interned meanwhile, which marshal's format 4 writes down), so a webhook could rename its ConfigMap.
    build = ("import hashlib, sys; {}from trainhook.launcher import deliver; "
             "print(hashlib.sha256(deliver.build_zip()).hexdigest())")
    plain, interned = (subprocess.run([sys.executable, "-c", build.format(first)], capture_output=True, text=True,
                                      check=True).stdout for first in ("", "[sys.intern(chr(i)) for i in range(256)]; "))
    assert plain == interned



def test_the_bytecode_has_no_docstrings_but_keeps_its_line_numbers_and_asserts():
    """Docstrings are left out of the bytecode only (a third of the zip): the source beside it keeps them, and the
    code keeps its line numbers (a traceback shows the right line) and its asserts."""
    import ast
    import dis
    import marshal

    def code_objects(code, prefix=""):
        found = {prefix + code.co_name: code}
        for const in code.co_consts:
            if hasattr(const, "co_name"):
                found.update(code_objects(const, prefix + code.co_name + "."))
        return found

    name = "trainhook/launcher/coordination/member_run.py"
    source = dict(deliver.in_pod_modules())[name].read_bytes()
    with zipfile.ZipFile(io.BytesIO(ZIP)) as archive:
        assert archive.read(name) == source
        ours = code_objects(marshal.loads(archive.read(name + "c")[16:]))
    theirs = code_objects(compile(source, name, "exec", dont_inherit=True))
    docstrings = {ast.get_docstring(node, clean=False) for node in ast.walk(ast.parse(source))
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))} - {None}
    assert len(docstrings) > 5 and len(ours) > 10 and ours.keys() == theirs.keys()
    for qualified, code in ours.items():
        assert not docstrings & {c for c in code.co_consts if isinstance(c, str)}, qualified
        assert code.co_firstlineno == theirs[qualified].co_firstlineno, qualified
    asserting = [q for q, code in theirs.items() if any(i.opname == "LOAD_ASSERTION_ERROR"
                                                        for i in dis.get_instructions(code))]
    assert asserting and all(any(i.opname == "LOAD_ASSERTION_ERROR" for i in dis.get_instructions(ours[q]))
                             for q in asserting)
