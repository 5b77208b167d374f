"""tests/e2e runs first and in one piece, whatever the rooms sort to (tests/conftest.py's ordering hook).

Why: the e2e conftest stops the node right after the last e2e test, and `trainhook local` tests (network
namespaces) must never run while the node has pods. Collection alone sorts tests/chart and tests/cli before
tests/e2e, so without the hook `make test` would run them first and the node would stop after the whole run.
The run is a real `pytest --collect-only` of the whole tree, as `make test` collects it (nothing is started).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_e2e_items_come_first_and_together_in_the_collected_run():
    env = {k: v for k, v in os.environ.items() if k != "TRAINHOOK_E2E"}
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ids = [line for line in done.stdout.splitlines() if "::" in line]
    e2e = [i for i, test_id in enumerate(ids) if test_id.startswith("tests/e2e/")]
    assert e2e, "no tests/e2e item collected"
    assert e2e == list(range(len(e2e))), f"tests/e2e is not a prefix of the run: first non-e2e item {ids[0]}"
    rooms = {test_id.split("/")[1] for test_id in ids[len(e2e):]}
    assert {"chart", "cli"} <= rooms  # the rooms that sort before e2e by name are collected, after it
