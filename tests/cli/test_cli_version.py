"""`trainhook --version` says the version: the installed package's, else (a source tree run without installing)
pyproject.toml's."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from trainhook.cli import version

ROOT = Path(__file__).resolve().parents[2]


def test_the_installed_cli_prints_the_installed_version():
    result = subprocess.run([sys.executable, "-m", "trainhook.cli", "--version"], capture_output=True, text=True,
                            timeout=60)
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == f"trainhook {metadata.version('trainhook')}\n"


def test_without_package_metadata_the_version_is_pyprojects():
    with open(ROOT / "pyproject.toml", "rb") as f:
        expected = tomllib.load(f)["project"]["version"]
    assert version("trainhook-no-such-distribution") == expected
