#!/usr/bin/env python3
"""`make lint`: ruff, the import contracts (lint-imports) and mypy; every setting is in pyproject.toml.

Each tool runs on the checkout as it is: the code lives where its import name says (trainhook/webhook/ is
trainhook.webhook), so no tool needs a remap, a link tree or a build step (docs/develop/checks.md).

    python hack/lint.py            # all three; exit 1 when one finds something
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent  # the virtualenv's scripts: ruff, lint-imports, mypy (the `test` extra)


def step(title: str, command: list[str], fix: str) -> bool:
    """Run one check in the checkout; print its findings and what to do about them."""
    print(f"==> {title}: {' '.join(command[:2])} ...", flush=True)
    started = time.monotonic()
    try:
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    except FileNotFoundError:
        print(f"    {command[0]} is not installed: make install (pip install -e '.[test]')")
        return False
    output = done.stdout + done.stderr
    if done.returncode != 0:
        print(output.rstrip())
        print(f"    FAILED ({time.monotonic() - started:.1f}s): {fix}")
        return False
    print(f"    ok ({time.monotonic() - started:.1f}s)")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    config = str(REPO / "pyproject.toml")
    passed = [
        step("ruff (errors and style; [tool.ruff])", [str(BIN / "ruff"), "check", "--output-format", "concise", "."],
             "fix the lines above (`ruff check --fix` fixes those marked [*])"),
        step("lint-imports (the layers; [tool.importlinter])", [str(BIN / "lint-imports"), "--no-logo", "--no-cache",
                                                                  config],
             "an import crosses a layer: move the code, or change the contract with the lead's agreement"),
        step("mypy (types; [tool.mypy])", [str(BIN / "mypy"), "--config-file", config, "--cache-dir",
                                          str(REPO / "build" / "mypy-cache"), "-p", "trainhook"],
             "fix the types above"),
    ]
    return 0 if all(passed) else 1


if __name__ == "__main__":
    sys.exit(main())
