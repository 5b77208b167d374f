"""A local container's processes as a runtime sees them: its main process's exit, the kubelet's restart rule, and
ending every process of a container when its main process ends.

Apart from the supervisor (which decides when containers run) because these are the runtime's mechanics, the
same for every pod and every run.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

# TH_LOCAL_CONTAINER is set on every container's processes: what finds them all when the container ends
# (`_kill_session`).
from trainhook.gang.keys import TH_LOCAL_CONTAINER


async def exited(proc: asyncio.subprocess.Process, poll: float = 0.05) -> int:
    """The main process's exit status, as soon as it has exited. (`proc.wait()` also waits for its stdout to
    close, which a process left behind in the container can hold open; the container ends with its main
    process, so the supervisor waits for this instead.)"""
    while proc.returncode is None:
        await asyncio.sleep(poll)
    return proc.returncode


def exit_code(returncode: int) -> int:
    """A process's status as Kubernetes reports a container's: 128+N when killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def restarts(policy: str, code: int) -> bool:
    """Whether the kubelet restarts a container that exited with `code` under the pod's restartPolicy."""
    return policy == "Always" or (policy == "OnFailure" and code != 0)


def _kill_session(sid: int, mark: str | None = None) -> None:
    """SIGKILL every process of a container, as a runtime does when its main process ends: every process of
    session `sid` (its main process started it), whatever process group it moved to, and every process whose
    environment carries the container's `mark` (TH_LOCAL_CONTAINER), which catches the ones that left the
    session (torchrun starts its workers in sessions of their own) and outlived their parents."""
    _killpg(sid, signal.SIGKILL)
    needle = f"{TH_LOCAL_CONTAINER}={mark}".encode() if mark else None
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state ppid pgrp session ...
            if int(fields[3]) == sid or (needle and needle in (entry / "environ").read_bytes().split(b"\0")):
                os.kill(int(entry.name), signal.SIGKILL)
        except (OSError, ValueError, IndexError):
            continue


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
