"""The in-pod module set runs anywhere a Python 3.8+ does, with the standard library alone.

The launcher is delivered into the user's own training image and run by that image's Python (deliver.py): the
set is trainhook/__init__.py, the gang model (trainhook/gang/: keys.py, the shape, the lookup, the wiring, the
framework and failure rules) and every module of trainhook/launcher/ with its rooms (coordination/, mpi/, wait/).
What holds it:
- every import in the set (inside functions too) is of the standard library or of the set itself;
- the set is Python 3.8 (vermin finds the library features newer than that; ast.parse with feature_version
  the syntax; a scan of the syntax tree the generics that are evaluated at run time, which vermin misses);
- a zip of the set runs real commands with `python -I -S` (no site-packages at all) under every interpreter
  here: /root/.pyenv's 3.8 when present, and this one.
"""

from __future__ import annotations

import ast
import glob
import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from gang_notary import GangNotary, indexed_job

import trainhook
import trainhook.launcher
from trainhook.launcher import deliver
from webhook_process import free_port

TOP = Path(trainhook.__file__).parent
LAUNCHER = Path(trainhook.launcher.__file__).parent
# Imports that leave the set on purpose, each with why it is safe.
ALLOWED = {
    # trainhook.TrainingClient, the SDK, loaded on first attribute access (PEP 562); the launcher never asks.
    ("trainhook/__init__.py", "trainhook.sdk"),
}
PYTHONS = sorted(glob.glob("/root/.pyenv/versions/3.8*/bin/python")) + [sys.executable]


def in_pod_set() -> dict[str, Path]:
    """Module name -> source file, for every module of the in-pod set (trainhook/gang/ and trainhook/launcher/ with
    their subpackages)."""
    modules = {"trainhook": TOP / "__init__.py"}
    for folder in ("gang", "launcher"):
        for path in sorted((TOP / folder).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = path.relative_to(TOP.parent).with_suffix("").parts
            modules[".".join(parts[:-1] if path.stem == "__init__" else parts)] = path
    return modules


def build_launcher_zip(path: Path) -> Path:
    """The delivered launcher, as the init container writes it (launcher/deliver.py): the set in the package
    layout and a __main__ that checks the Python version, then runs trainhook-launch."""
    path.write_bytes(deliver.build_zip())
    return path


def test_the_delivered_zip_holds_exactly_the_in_pod_set():
    names = set(zipfile.ZipFile(io.BytesIO(deliver.build_zip())).namelist())
    expected = {path.relative_to(TOP.parent).as_posix() for path in in_pod_set().values()}
    sources = {name for name in names if not name.endswith(".pyc")}
    assert sources == expected | {"__main__.py"}
    # beside each source its bytecode, but for the modules deliver.SOURCE_ONLY ships as source alone
    assert {name[:-1] for name in names - sources} == {
        name for name in sources
        if not deliver.source_only(name)}


def relative(path: Path) -> str:
    return path.relative_to(TOP.parent).as_posix()


# --- only the standard library -----------------------------------------------------------------------------------

def type_checking_only(tree: ast.Module) -> set[int]:
    """ids of the nodes under `if TYPE_CHECKING:` (never run)."""
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test):
            skipped.update(id(child) for statement in node.body for child in ast.walk(statement))
    return skipped


PACKAGES = tuple(module for module, path in in_pod_set().items() if path.name == "__init__.py")


def imported_modules(tree: ast.Module, package: str) -> list[str]:
    """Every module an `import` or `from` anywhere in the tree loads, relative imports resolved against
    `package`. `from P import N` loads P.N when P is one of our packages (their __init__ defines nothing to
    import), else P."""
    skipped, names = type_checking_only(tree), []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            base = ".".join(parts + ([node.module] if node.module else []))
            names += [f"{base}.{alias.name}" if base in PACKAGES else base for alias in node.names]
    return names


def test_every_import_of_the_in_pod_set_is_the_standard_library_or_the_set():
    modules = in_pod_set()
    assert "trainhook.launcher.cli" in modules and "trainhook.launcher.mpi.kube_api" in modules
    outside = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for name in imported_modules(tree, package):
            top = name.split(".")[0]
            if name in modules or (top in sys.stdlib_module_names and top != "trainhook"):
                continue
            if (relative(path), name) not in ALLOWED:
                outside.append(f"{relative(path)}: {name}")
        text = path.read_text()
        assert "import_module(" not in text and "__import__(" not in text, f"{path}: a dynamic import"
    assert outside == [], "the in-pod set imports outside the standard library and itself"


def test_the_scan_sees_imports_inside_functions_and_from_packages():
    tree = ast.parse("def f():\n    import yaml\n    from trainhook.launcher.mpi import kube_api, nothing\n"
                     "from trainhook import keys, sdk\nif TYPE_CHECKING:\n    import kubernetes\n")
    assert imported_modules(tree, "trainhook.launcher") == [
        "trainhook.keys", "trainhook.sdk", "yaml", "trainhook.launcher.mpi.kube_api", "trainhook.launcher.mpi.nothing"]
    relative = ast.parse("from . import run\nfrom .pod_view import GangView\nfrom .. import keys\n")
    assert imported_modules(relative, "trainhook.launcher") == [
        "trainhook.launcher.run", "trainhook.launcher.pod_view", "trainhook.keys"]


# --- Python 3.8 ------------------------------------------------------------------------------------------------

def annotation_nodes(tree: ast.Module) -> set[int]:
    """ids of every node inside an annotation (never evaluated: the set uses `from __future__ import annotations`)."""
    found = set()
    for node in ast.walk(tree):
        annotations = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            arguments = node.args
            annotations = [node.returns] + [a.annotation for a in arguments.posonlyargs + arguments.args
                                            + arguments.kwonlyargs + [arguments.vararg, arguments.kwarg] if a]
        elif isinstance(node, ast.AnnAssign):
            annotations = [node.annotation]
        for annotation in annotations:
            if annotation is not None:
                found.update(id(child) for child in ast.walk(annotation))
    return found


def runtime_generics(tree: ast.Module) -> list[str]:
    """`list[str]` and friends where Python evaluates them (a base class, an alias, a call): 3.9 and newer."""
    skipped = annotation_nodes(tree)
    return [f"line {node.lineno}: {ast.unparse(node)}" for node in ast.walk(tree)
            if isinstance(node, ast.Subscript) and id(node) not in skipped and isinstance(node.value, ast.Name)
            and node.value.id in ("list", "dict", "tuple", "set", "frozenset", "type")]


@pytest.mark.parametrize("module", sorted(in_pod_set()))
def test_each_module_is_python_38_syntax_with_unevaluated_annotations(module):
    path = in_pod_set()[module]
    tree = ast.parse(path.read_text(), str(path), feature_version=(3, 8))
    annotated = bool(annotation_nodes(tree))
    future = any(isinstance(n, ast.ImportFrom) and n.module == "__future__" and
                 any(a.name == "annotations" for a in n.names) for n in tree.body)
    assert future or not annotated, f"{path}: annotations without `from __future__ import annotations`"
    assert runtime_generics(tree) == [], f"{path}: builtin generics evaluated at run time need Python 3.9"


def test_runtime_generics_are_found_and_annotations_are_not():
    tree = ast.parse("class P(list[str]):\n    x: dict[str, int] = {}\n    def f(self, a: set[int]) -> tuple[int]:\n"
                     "        return cast(dict[str, int], a)\n")
    assert runtime_generics(tree) == ["line 1: list[str]", "line 4: dict[str, int]"]


def test_vermin_finds_nothing_newer_than_python_38():
    """vermin (a test extra) knows which version brought each module, function and keyword; `# novm` marks a
    line it cannot see is guarded by a version check."""
    paths = [str(path) for path in in_pod_set().values()]
    run_vermin = "import sys; from vermin import main; sys.exit(main())"
    done = subprocess.run([sys.executable, "-c", run_vermin, "-t=3.8-", "--violations", "--no-tips", *paths],
                          capture_output=True, text=True, timeout=300)
    if "No module named 'vermin'" in done.stderr:
        pytest.fail("vermin is not installed: pip install -e '.[test]'")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Minimum required versions: 3.8" in done.stdout, done.stdout


# --- the zip, run --------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def launcher_zip(tmp_path_factory) -> Path:
    return build_launcher_zip(tmp_path_factory.mktemp("delivered") / "launcher.pyz")


def python_id(python: str) -> str:
    return "this-python" if python == sys.executable else Path(python).parent.parent.name


def launch(python: str, launcher_zip: Path, *args: str, env: dict | None = None, timeout: float = 60):
    """`python -I -S launcher.pyz ARGS`, with nothing but PATH and `env` (as a container would start it)."""
    return subprocess.run([python, "-I", "-S", str(launcher_zip), *args], capture_output=True, text=True,
                          timeout=timeout, env={"PATH": os.environ["PATH"], **(env or {})})


def gang(framework: str, job: str, replicas: str, hosts: str, role: str, index: int, **more: str) -> dict:
    return {"TRAINHOOK_FRAMEWORK": framework, "TRAINHOOK_JOB_NAME": job, "TRAINHOOK_NAMESPACE": "team-a",
            "TRAINHOOK_REPLICAS": replicas, "TRAINHOOK_HOSTS": hosts, "TRAINHOOK_SUBDOMAIN": job,
            "TRAINHOOK_ROLE": role, "TRAINHOOK_INDEX": str(index), **more}


@pytest.fixture(params=PYTHONS, ids=python_id)
def python(request) -> str:
    return request.param


def test_the_zip_runs_a_command_and_exits_with_its_code(python, launcher_zip):
    done = launch(python, launcher_zip, "run", "--", "sh", "-c", "echo from the image; exit 3")
    assert (done.returncode, done.stdout) == (3, "from the image\n"), done.stderr
    missing = launch(python, launcher_zip, "run", "--", "no-such-command")
    assert missing.returncode == 127
    assert missing.stderr.strip() == "trainhook-launch: command not found: no-such-command"


def test_the_zip_prints_kubeflows_tf_config(python, launcher_zip):
    env = gang("tensorflow", "t", "chief=1,worker=2", "chief=t-chief,worker=t-worker", "worker", 1,
               TRAINHOOK_PORT="2222")
    done = launch(python, launcher_zip, "tf-config", env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ('{"cluster":{"chief":["t-chief-0.t:2222"],"worker":["t-worker-0.t:2222",'
                           '"t-worker-1.t:2222"]},"task":{"type":"worker","index":1},"environment":"cloud"}\n')


def test_the_zip_waits_and_names_who_is_missing(python, launcher_zip):
    """No gang name resolves here (no cluster DNS), so the dns wait runs to its deadline and names everyone."""
    env = gang("pytorch", "w", "master=1,worker=1", "master=w-master,worker=w-worker", "master", 0)
    off = launch(python, launcher_zip, "wait", "--mode", "none", env=env)
    assert (off.returncode, off.stdout) == (0, "trainhook-launch wait: gang wait is off (none); not waiting\n")
    dns = launch(python, launcher_zip, "wait", "--mode", "dns", "--timeout", "1", env=env)
    assert dns.returncode == 1
    assert dns.stderr == ("trainhook-launch wait: gave up after 1s: 2 of 2 members missing: rank 0 (master-0 at "
                          "w-master-0.w): its address does not resolve; rank 1 (worker-0 at w-worker-0.w): its "
                          "address does not resolve\n")


@pytest.mark.parametrize("code", [0, 3])
def test_a_gang_run_from_the_zip_gets_its_key_from_the_notary_and_records_the_outcome(python, launcher_zip, code,
                                                                                      tmp_path):
    """The delivered launcher (standard library only, on every Python it supports) in a one-member Job gang admitted
    by the real webhook: it asks the real notary (HTTPS, the webhook's CA) for its key with its pod's token, runs
    the training, and records the outcome, which the notary writes on the Job."""
    with GangNotary(tmp_path / "run") as notary:
        [pod] = notary.admit(indexed_job("solo", "team-a", restart_policy="Never"))
        env = {**notary.env(pod), "TRAINHOOK_COORDINATOR_PORT": str(free_port()),
               "TRAINHOOK_STATE_DIR": str(tmp_path / "state")}
        done = launch(python, launcher_zip, "run", "--", "sh", "-c", f"echo training; exit {code}", env=env)
        assert (done.returncode, done.stdout) == (code, "training\n"), done.stderr
        phase = "Succeeded" if code == 0 else "Failed"
        assert f"the notary recorded the outcome: {phase}" in done.stderr, done.stderr
        annotations = notary.workload("team-a", "Job", "solo")["metadata"]["annotations"]
        assert (annotations["trainhook.dev/phase"], annotations["trainhook.dev/exit-code"]) == (phase, str(code))


def test_the_zip_execs_in_a_pod_over_the_websocket(python, launcher_zip, tmp_path):
    from exec_double import ExecServer
    server = ExecServer(tmp_path / "serviceaccount")
    try:
        done = subprocess.run([python, "-I", "-S", str(launcher_zip), "kubexec", "--transport", "kubexec",
                               "w-0.pi", "exit", "7"], input=b"hi\n", capture_output=True, timeout=60,
                              env={"PATH": os.environ["PATH"], **server.env})
    finally:
        server.stop()
    assert done.returncode == 7, done.stderr
    assert done.stdout.startswith(b"HI\ndone\n") and done.stderr == b"warning\n"
    assert json.loads(json.dumps(server.requests[0]["query"]))[:3] == [["command", "/bin/sh"], ["command", "-c"],
                                                                       ["command", "exit 7"]]


# Every file of the delivered launcher, named (issue 30): a module added to, moved within or removed from the in-pod
# set changes what runs in every user's pod, so it changes this list on purpose. The launcher ConfigMap carries the
# same zip (webhook/launcher_configmap.py), checked below by decoding the ConfigMap the webhook would write.
ZIP_WITH_BYTECODE = [
    '__main__.py',
    'trainhook/__init__.py',
    'trainhook/gang/__init__.py',
    'trainhook/gang/failure_rules.py',
    'trainhook/gang/framework_rules.py',
    'trainhook/gang/keys.py',
    'trainhook/gang/lookup.py',
    'trainhook/gang/shape.py',
    'trainhook/launcher/__init__.py',
    'trainhook/launcher/child.py',
    'trainhook/launcher/cli.py',
    'trainhook/launcher/coordination/__init__.py',
    'trainhook/launcher/coordination/coordinator.py',
    'trainhook/launcher/coordination/coordinator_rules.py',
    'trainhook/launcher/coordination/elastic.py',
    'trainhook/launcher/coordination/failure_cause.py',
    'trainhook/launcher/coordination/link.py',
    'trainhook/launcher/coordination/member_run.py',
    'trainhook/launcher/coordination/pending.py',
    'trainhook/launcher/coordination/report.py',
    'trainhook/launcher/ending.py',
    'trainhook/launcher/files.py',
    'trainhook/launcher/notary_client.py',
    'trainhook/launcher/outcome.py',
    'trainhook/launcher/output_tail.py',
    'trainhook/launcher/pod_view.py',
    'trainhook/launcher/policy.py',
    'trainhook/launcher/process.py',
    'trainhook/launcher/progress.py',
    'trainhook/launcher/reach.py',
    'trainhook/launcher/run.py',
    'trainhook/launcher/speak.py',
    'trainhook/launcher/torchrun.py',
    'trainhook/launcher/wire.py',
]
ZIP_SOURCE_ONLY = [
    'trainhook/gang/wiring.py',
    'trainhook/launcher/deliver.py',
    'trainhook/launcher/mpi/__init__.py',
    'trainhook/launcher/mpi/control.py',
    'trainhook/launcher/mpi/doorman.py',
    'trainhook/launcher/mpi/gang_transport.py',
    'trainhook/launcher/mpi/kube_api.py',
    'trainhook/launcher/mpi/kube_websocket.py',
    'trainhook/launcher/mpi/kubexec.py',
    'trainhook/launcher/mpi/launch.py',
    'trainhook/launcher/mpi/local_transport.py',
    'trainhook/launcher/mpi/spawn.py',
    'trainhook/launcher/mpi/worker.py',
    'trainhook/launcher/tf_config.py',
    'trainhook/launcher/wait/__init__.py',
    'trainhook/launcher/wait/command.py',
    'trainhook/launcher/wait/dns.py',
    'trainhook/launcher/wait/gathering.py',
    'trainhook/launcher/wait/tcp.py',
    'trainhook/launcher/wait/tcp_lines.py',
]


def test_the_zip_and_the_launcher_configmap_carry_exactly_the_listed_modules():
    import base64

    from trainhook.webhook import launcher_configmap

    def listed(zip_bytes: bytes) -> tuple[list[str], list[str]]:
        names = zipfile.ZipFile(io.BytesIO(zip_bytes)).namelist()
        sources = sorted(name for name in names if not name.endswith(".pyc"))
        return ([name for name in sources if name + "c" in names], [name for name in sources if name + "c" not in names])

    assert listed(deliver.build_zip()) == (sorted(ZIP_WITH_BYTECODE), sorted(ZIP_SOURCE_ONLY))
    zip_bytes, entry = launcher_configmap.content()
    name = launcher_configmap.configmap_name(zip_bytes, entry)
    body = launcher_configmap.configmap(name, "team-a", zip_bytes, entry)
    carried = base64.b64decode(body["binaryData"][launcher_configmap.ZIP_KEY])
    assert listed(carried) == (sorted(ZIP_WITH_BYTECODE), sorted(ZIP_SOURCE_ONLY))
