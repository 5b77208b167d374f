"""The checks of `make lint` (hack/lint.py) fail on what they are there to stop.

`make lint` passing on the checkout says little unless each check is seen to refuse a bad input: the import
contracts a forbidden import (each layer of pyproject's [tool.importlinter]), ruff an unused import or a line over
120 (and newer syntax in the in-pod set, which runs on Python 3.8), mypy a type error, and the package check a
folder pyproject does not list. Every run uses the repository's own pyproject.toml, so a contract or rule
weakened there shows here.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = next(parent for parent in Path(__file__).resolve().parents if (parent / "pyproject.toml").is_file())
CONFIG = REPO / "pyproject.toml"
BIN = Path(sys.executable).parent
_spec = importlib.util.spec_from_file_location("hack_lint", REPO / "hack" / "lint.py")
lint = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lint)


def tool(name: str) -> str:
    path = BIN / name
    if not path.exists():
        pytest.fail(f"{name} is not installed: pip install -e '.[test]'")
    return str(path)


# --- the import contracts -----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def layout(tmp_path_factory) -> Path:
    return lint.lay_out(tmp_path_factory.mktemp("layout") / "tree")


def lint_imports(tree: Path) -> subprocess.CompletedProcess:
    return subprocess.run([tool("lint-imports"), "--no-logo", "--no-cache", str(CONFIG)], cwd=tree,
                          capture_output=True, text=True, timeout=120)


def test_the_laid_out_tree_is_the_installed_layout(layout):
    """What lint-imports and mypy read: webhook/server.py as trainhook/webhook/server.py, a link to the file."""
    server = layout / "trainhook" / "webhook" / "server.py"
    assert server.is_symlink() and server.resolve() == REPO / "webhook" / "server.py"
    assert (layout / "trainhook" / "launcher" / "cli.py").resolve() == REPO / "launcher" / "cli.py"
    assert (layout / "trainhook" / "gang" / "keys.py").resolve() == REPO / "trainhook" / "gang" / "keys.py"


def test_the_checkout_keeps_every_contract(layout):
    done = lint_imports(layout)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 kept, 0 broken" in done.stdout, done.stdout


@pytest.mark.parametrize(("module", "line", "broken"), [
    ("trainhook/launcher/wait.py", "import yaml", "trainhook.launcher is not allowed to import yaml"),
    ("trainhook/gang/keys.py", "import aiohttp", "trainhook.gang is not allowed to import aiohttp"),
    ("trainhook/gang/shape.py", "from trainhook.webhook import jsondiff",
     "trainhook.gang is not allowed to import trainhook.webhook"),
    ("trainhook/webhook/jsondiff.py", "from trainhook.local import manifest",
     "trainhook.webhook is not allowed to import trainhook.local"),
    ("trainhook/webhook/jsondiff.py", "import trainhook.cli", "trainhook.webhook is not allowed to import trainhook.cli"),
    ("trainhook/certs/build.py", "from trainhook.launcher import wait",
     "trainhook.certs is not allowed to import trainhook.launcher"),
])
def test_a_forbidden_import_breaks_its_contract(tmp_path, module, line, broken):
    """The same tree with one module's link replaced by a copy that adds one import, inside a function (where the
    launcher's lazy imports are)."""
    tree = lint.lay_out(tmp_path / "tree")
    target = tree / module
    source = target.resolve().read_text()
    target.unlink()
    target.write_text(source + f"\n\ndef _added():\n    {line}\n")
    done = lint_imports(tree)
    assert done.returncode == 1, done.stdout + done.stderr
    assert broken in done.stdout, done.stdout
    assert "1 broken" in done.stdout, done.stdout


# --- ruff ----------------------------------------------------------------------------------------------------------

def ruff(text: str, as_path: str) -> subprocess.CompletedProcess:
    """ruff on `text` as if it were the checkout's file `as_path` (per-path rules apply)."""
    return subprocess.run([tool("ruff"), "check", "--config", str(CONFIG), "--output-format", "concise",
                           "--stdin-filename", str(REPO / as_path), "-"], input=text, capture_output=True,
                          text=True, timeout=60, cwd=REPO)


def test_ruff_refuses_an_unused_import_and_a_line_over_120():
    assert ruff("import os\n", "webhook/new.py").returncode == 1
    assert "F401" in ruff("import os\n", "webhook/new.py").stdout
    fits = f"X = '{'a' * 114}'\n"
    assert len(fits) - 1 == 120 and ruff(fits, "webhook/new.py").returncode == 0
    too_long = ruff(f"X = '{'a' * 115}'\n", "webhook/new.py")
    assert too_long.returncode == 1 and "E501" in too_long.stdout


def test_ruff_asks_for_newer_syntax_outside_the_in_pod_set_only():
    """The in-pod set stays Python 3.8: `Optional[int]` is what it writes where an annotation may be evaluated."""
    old = "from __future__ import annotations\n\nfrom typing import Optional\n\n\ndef f(x: Optional[int]) -> None:\n" \
          "    pass\n"
    webhook = ruff(old, "webhook/new.py")
    assert webhook.returncode == 1 and "UP045" in webhook.stdout
    for in_pod in ("launcher/new.py", "trainhook/gang/keys.py", "trainhook/gang/new.py"):
        done = ruff(old, in_pod)
        assert done.returncode == 0, (in_pod, done.stdout)


# --- mypy and the package list -------------------------------------------------------------------------------------

def test_mypy_refuses_a_type_error(tmp_path):
    (tmp_path / "bad.py").write_text("def f() -> int:\n    return 'one'\n")
    done = subprocess.run([tool("mypy"), "--config-file", str(CONFIG), "--cache-dir", str(tmp_path / "cache"),
                           str(tmp_path / "bad.py")], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "bad.py:2: error: Incompatible return value type" in done.stdout, done.stdout


def test_a_package_folder_pyproject_does_not_list_is_found(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[tool.setuptools]\npackage-dir = { "app" = "app", "app.web" = "web" }\npackages = ["app", "app.web"]\n')
    for folder in ("app", "web", "web/forms", "app/new", "app/__pycache__"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "__init__.py").write_text("")
    assert lint.unlisted_packages(tmp_path) == ["app/new", "web/forms"]
    assert lint.source_folder("app.web.forms", {"app": "app", "app.web": "web"}) == "web/forms"
    assert lint.unlisted_packages(REPO) == []
