"""Small helpers shared by the tests: polling with a deadline, and reading `trainhook local`'s summary."""

from __future__ import annotations

import re
import time
from pathlib import Path


def wait_for(what: str, check, timeout: float = 30.0, interval: float = 0.25):
    """Poll `check()` until it returns something truthy (returned), or fail naming `what` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def local_summary(stdout: str) -> dict[str, list[str]]:
    """POD -> [RANK, EXIT, DURATION, STATUS] from `trainhook local`'s closing table."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("POD "))
    rows = {}
    for line in lines[start + 1:]:
        if line.startswith("run "):
            break
        cells = line.split()
        rows[cells[0]] = cells[1:]
    return rows


def local_failure(result, limit: int = 3000) -> str:
    """What a failed `trainhook local` run says, for an assertion's message: the ends of its stdout and stderr and
    of the failing pod's own container logs (the run names their directory), which the summary's tail can miss
    (a crash's lines come before the gang's stop)."""
    parts = [result.stdout[-limit:], result.stderr[-limit:]]
    named = re.search(r"\(the failing pod's: ([^)]+?)/?\)", result.stdout + result.stderr)
    if named and Path(named[1]).is_dir():
        for log in sorted(Path(named[1]).glob("*.log")):
            parts.append(f"--- {log}\n{log.read_text(errors='replace')[-limit:]}")
    return "\n".join(parts)
