"""Small helpers shared by the tests: polling with a deadline, and reading `trainhook local`'s summary."""

from __future__ import annotations

import time


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
