#!/usr/bin/env python3
"""`make lint`: ruff, the import contracts (lint-imports) and mypy; every setting is in pyproject.toml.

Why a tree of links: webhook/, launcher/, certs/ install as trainhook.webhook etc. (pyproject's package-dir), so
`trainhook.webhook.server` names no path under the checkout, and lint-imports and mypy both look in the current
directory first, where trainhook/ has no webhook/. This script lays out what the wheel holds, as links to the
checkout's files, in build/lint/ (made anew each run, so a file added a second ago is checked) and points the two
tools there; their findings are printed with the checkout's paths. Editors use the same tree ([tool.pyright]
extraPaths; docs/develop/checks.md says why not setuptools' strict editable mode).

It first checks that pyproject lists every package folder: a folder it does not list is missing from the wheel,
the images and a strict editable install, though the checkout imports it.

    python hack/lint.py            # all three; exit 1 when one finds something
    python hack/lint.py --tree D   # only lay out the tree in D (tests/repo/test_structure_checks.py)
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent  # the virtualenv's scripts: ruff, lint-imports, mypy (the `test` extra)


def setuptools_layout(repo: Path = REPO) -> tuple[dict[str, str], list[str]]:
    """pyproject's package-dir (package -> folder) and its list of packages."""
    config = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"]
    return config["package-dir"], config["packages"]


def source_folder(package: str, package_dir: dict[str, str]) -> str:
    """The checkout's folder of `package`, through the longest package-dir entry that holds it."""
    parts = package.split(".")
    for cut in range(len(parts), 0, -1):
        base = ".".join(parts[:cut])
        if base in package_dir:
            return "/".join([package_dir[base], *parts[cut:]])
    return "/".join(parts)


def unlisted_packages(repo: Path = REPO) -> list[str]:
    """Package folders (an __init__.py) under the installed folders that pyproject's `packages` leaves out."""
    package_dir, packages = setuptools_layout(repo)
    listed = {source_folder(package, package_dir) for package in packages}
    found = set()
    for root in set(package_dir.values()):
        for init in (repo / root).rglob("__init__.py"):
            folder = init.parent.relative_to(repo).as_posix()
            if "__pycache__" not in folder:
                found.add(folder)
    return sorted(found - listed)


def lay_out(tree: Path, repo: Path = REPO) -> Path:
    """Links in `tree` to every module of the listed packages, where the wheel puts it (trainhook/webhook/...)."""
    package_dir, packages = setuptools_layout(repo)
    shutil.rmtree(tree, ignore_errors=True)
    for package in packages:
        into = tree.joinpath(*package.split("."))
        into.mkdir(parents=True, exist_ok=True)
        for source in sorted((repo / source_folder(package, package_dir)).glob("*.py")):
            (into / source.name).symlink_to(source)
    return tree


def step(title: str, command: list[str], fix: str, *, cwd: Path = REPO, env: dict | None = None,
         tree: Path | None = None) -> bool:
    """Run one check; print its findings (paths in the tree shown as the checkout's) and what to do about them."""
    print(f"==> {title}: {' '.join(command[:2])} ...", flush=True)
    started = time.monotonic()
    try:
        done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    except FileNotFoundError:
        print(f"    {command[0]} is not installed: make install (pip install -e '.[test]')")
        return False
    output = done.stdout + done.stderr
    if tree is not None:
        output = re.sub(rf"(?m)^(?:{re.escape(str(tree))}|{re.escape(os.path.relpath(tree, REPO))})/(\S+?\.py)",
                        lambda m: os.path.relpath(os.path.realpath(tree / m.group(1)), REPO), output)
    if done.returncode != 0:
        print(output.rstrip())
        print(f"    FAILED ({time.monotonic() - started:.1f}s): {fix}")
        return False
    print(f"    ok ({time.monotonic() - started:.1f}s)")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, help="only lay out the tree of links in TREE")
    args = parser.parse_args(argv)
    if args.tree:
        lay_out(args.tree)
        return 0
    unlisted = unlisted_packages()
    if unlisted:
        print(f"==> pyproject.toml's [tool.setuptools] packages leaves out {', '.join(unlisted)}: the wheel, the "
              "images and `make install` would miss it; add it there")
        return 1
    tree = lay_out(REPO / "build" / "lint")
    config = str(REPO / "pyproject.toml")
    passed = [
        step("ruff (errors and style; [tool.ruff])", [str(BIN / "ruff"), "check", "--output-format", "concise", "."],
             "fix the lines above (`ruff check --fix` fixes those marked [*])"),
        step("lint-imports (the layers; [tool.importlinter])", [str(BIN / "lint-imports"), "--no-logo", "--no-cache",
                                                                  config],
             "an import crosses a layer: move the code, or change the contract with the lead's agreement",
             cwd=tree),
        step("mypy (types; [tool.mypy])", [str(BIN / "mypy"), "--config-file", config, "--cache-dir",
                                          str(REPO / "build" / "mypy-cache"), "-p", "trainhook"],
             "fix the types above", env={**os.environ, "MYPYPATH": str(tree)}, tree=tree),
    ]
    return 0 if all(passed) else 1


if __name__ == "__main__":
    sys.exit(main())
