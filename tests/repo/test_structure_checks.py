"""The checks of `make lint` (hack/lint.py) fail on what they are there to stop.

`make lint` passing on the checkout says little unless each check is seen to refuse a bad input: the import
contracts a forbidden import (each layer of pyproject's [tool.importlinter]), ruff an unused import or a line over
120 (and newer syntax in the in-pod set, which runs on Python 3.8), mypy a type error. Every tool reads the checkout as
it is (no remap, no link tree: issue 30), and the wheel finds every package folder. Every run uses the repository's own pyproject.toml, so a contract or rule
weakened there shows here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = next(parent for parent in Path(__file__).resolve().parents if (parent / "pyproject.toml").is_file())
CONFIG = REPO / "pyproject.toml"
BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    path = BIN / name
    if not path.exists():
        pytest.fail(f"{name} is not installed: pip install -e '.[test]'")
    return str(path)


# --- the import contracts -----------------------------------------------------------------------------------------

def lint_imports(tree: Path) -> subprocess.CompletedProcess:
    """lint-imports on the `trainhook` package under `tree` (first on the path, before the editable install)."""
    return subprocess.run([tool("lint-imports"), "--no-logo", "--no-cache", str(CONFIG)], cwd=tree,
                          env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True, text=True, timeout=120)


def test_the_checkout_keeps_every_contract_with_no_tree_and_no_remap():
    """lint-imports reads the checkout itself: trainhook/webhook/ is trainhook.webhook (issue 30, item 4)."""
    assert not (REPO / "trainhook" / "webhook").is_symlink() and (REPO / "trainhook" / "webhook" / "server.py").is_file()
    assert "package-dir" not in CONFIG.read_text()
    done = lint_imports(REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "6 kept, 0 broken" in done.stdout, done.stdout


def test_the_layout_folders_at_the_top_lead_to_the_code():
    """webhook/, launcher/ and certs/ at the top (the product's layout) are the same folders as trainhook/'s."""
    for name in ("webhook", "launcher", "certs"):
        top = REPO / name
        assert top.is_symlink() and top.resolve() == (REPO / "trainhook" / name).resolve(), name


@pytest.mark.parametrize(("module", "line", "broken"), [
    ("trainhook/launcher/wait/command.py", "import yaml", "trainhook.launcher is not allowed to import yaml"),
    ("trainhook/gang/keys.py", "import aiohttp", "trainhook.gang is not allowed to import aiohttp"),
    ("trainhook/gang/shape.py", "from trainhook.webhook.admission import jsondiff",
     "trainhook.gang is not allowed to import trainhook.webhook"),
    ("trainhook/webhook/admission/jsondiff.py", "from trainhook.local import manifest",
     "trainhook.webhook is not allowed to import trainhook.local"),
    ("trainhook/webhook/admission/jsondiff.py", "import trainhook.cli",
     "trainhook.webhook is not allowed to import trainhook.cli"),
    ("trainhook/certs/build.py", "from trainhook.launcher.wait import command",
     "trainhook.certs is not allowed to import trainhook.launcher"),
    ("trainhook/webhook/admission/pods.py", "from trainhook.webhook.notary import records",
     "trainhook.webhook.admission is not allowed to import trainhook.webhook.notary"),
    ("trainhook/webhook/admission/review.py", "import aiohttp",
     "trainhook.webhook.admission is not allowed to import aiohttp"),
    ("trainhook/webhook/admission/workloads.py", "import kubernetes",
     "trainhook.webhook.admission is not allowed to import kubernetes"),
    ("trainhook/webhook/notary/records.py", "from trainhook.webhook import server",
     "trainhook.webhook.notary is not allowed to import trainhook.webhook.server"),
    ("trainhook/launcher/coordination/report.py", "from trainhook.launcher.mpi import control",
     "trainhook.launcher.coordination is not allowed to import trainhook.launcher.mpi"),
    ("trainhook/launcher/wait/dns.py", "from trainhook.launcher.coordination import link",
     "trainhook.launcher.wait is not allowed to import trainhook.launcher.coordination"),
    ("trainhook/launcher/mpi/spawn.py", "from trainhook.launcher.wait import tcp",
     "trainhook.launcher.mpi is not allowed to import trainhook.launcher.wait"),
])
def test_a_forbidden_import_breaks_its_contract(tmp_path, module, line, broken):
    """A copy of the package with one module given one more import, inside a function (where the launcher's lazy
    imports are)."""
    shutil.copytree(REPO / "trainhook", tmp_path / "trainhook", ignore=shutil.ignore_patterns("__pycache__"))
    target = tmp_path / module
    target.write_text(target.read_text() + f"\n\ndef _added():\n    {line}\n")
    done = lint_imports(tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert broken in " ".join(done.stdout.split()), done.stdout  # lint-imports wraps its lines at 80
    assert " broken." in done.stdout and "0 broken" not in done.stdout, done.stdout


# --- ruff ----------------------------------------------------------------------------------------------------------

def ruff(text: str, as_path: str) -> subprocess.CompletedProcess:
    """ruff on `text` as if it were the checkout's file `as_path` (per-path rules apply)."""
    return subprocess.run([tool("ruff"), "check", "--config", str(CONFIG), "--output-format", "concise",
                           "--stdin-filename", str(REPO / as_path), "-"], input=text, capture_output=True,
                          text=True, timeout=60, cwd=REPO)


def test_ruff_refuses_an_unused_import_and_a_line_over_120():
    assert ruff("import os\n", "trainhook/webhook/new.py").returncode == 1
    assert "F401" in ruff("import os\n", "trainhook/webhook/new.py").stdout
    fits = f"X = '{'a' * 114}'\n"
    assert len(fits) - 1 == 120 and ruff(fits, "trainhook/webhook/new.py").returncode == 0
    too_long = ruff(f"X = '{'a' * 115}'\n", "trainhook/webhook/new.py")
    assert too_long.returncode == 1 and "E501" in too_long.stdout


def test_ruff_asks_for_newer_syntax_outside_the_in_pod_set_only():
    """The in-pod set stays Python 3.8: `Optional[int]` is what it writes where an annotation may be evaluated."""
    old = "from __future__ import annotations\n\nfrom typing import Optional\n\n\ndef f(x: Optional[int]) -> None:\n" \
          "    pass\n"
    webhook = ruff(old, "trainhook/webhook/new.py")
    assert webhook.returncode == 1 and "UP045" in webhook.stdout
    for in_pod in ("trainhook/launcher/new.py", "trainhook/gang/keys.py", "trainhook/gang/new.py"):
        done = ruff(old, in_pod)
        assert done.returncode == 0, (in_pod, done.stdout)


# --- mypy and the package list -------------------------------------------------------------------------------------

def test_mypy_refuses_a_type_error(tmp_path):
    (tmp_path / "bad.py").write_text("def f() -> int:\n    return 'one'\n")
    done = subprocess.run([tool("mypy"), "--config-file", str(CONFIG), "--cache-dir", str(tmp_path / "cache"),
                           str(tmp_path / "bad.py")], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "bad.py:2: error: Incompatible return value type" in done.stdout, done.stdout


def test_mypy_resolves_every_room_from_the_checkout(tmp_path):
    """No MYPYPATH, no link tree: a module that uses the webhook, the notary and the launcher's rooms is checked
    against their real definitions (a wrong use is caught, so the import was resolved, not ignored)."""
    probe = tmp_path / "probe.py"
    probe.write_text("from trainhook.webhook.admission.review import review\n"
                     "from trainhook.webhook.notary.records import parse_outcome\n"
                     "from trainhook.launcher.coordination.coordinator_rules import CoordinatorState\n"
                     "from trainhook.gang.wiring import hostfile\n"
                     "x: int = review\n")
    done = subprocess.run([tool("mypy"), "--config-file", str(CONFIG), "--cache-dir", str(tmp_path / "cache"),
                           str(probe)], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "probe.py:5: error: Incompatible types in assignment" in done.stdout, done.stdout
    assert "Cannot find implementation" not in done.stdout and "import-not-found" not in done.stdout, done.stdout


def test_the_wheel_finds_every_package_folder():
    """pyproject finds the packages (no list to forget): every folder of trainhook/ with an __init__.py ships."""
    from setuptools import find_packages
    found = set(find_packages(str(REPO), include=["trainhook*"]))
    folders = {".".join(init.parent.relative_to(REPO).parts) for init in (REPO / "trainhook").rglob("__init__.py")
               if "__pycache__" not in init.parts}
    assert folders <= found, folders - found
    assert {"trainhook.webhook.admission", "trainhook.webhook.notary", "trainhook.launcher.coordination",
            "trainhook.launcher.mpi", "trainhook.launcher.wait", "trainhook.webhook.admission.frameworks"} <= found
