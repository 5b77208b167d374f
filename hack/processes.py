"""The daemons the tests start (hack/cluster.py's etcd and API server, hack/node.py's containerd and kubelet), as
processes: free ports, death with the parent, and stopping by PID without ever signalling a PID the kernel reused.

Apart from hack/cluster.py because the control plane and the node both supervise their daemons this way, and
`down` may run in another process long after `up` (the PIDs come from a state file, not from Popen objects), so
every check here works from /proc and a marker (the state dir) on the command line. Standard library only, so
that `cluster.py down` and `env` run with any Python 3.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path


def free_port(address: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def parent_death_signal():
    """preexec_fn: the child gets SIGTERM when the process that started it dies (a killed pytest)."""
    import ctypes
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def is_ours(pid: int, marker: str) -> bool:
    """The PID still runs one of our commands (its command line names our state dir), not a reused PID."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return marker in cmdline


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (our exited child not yet reaped) is not alive.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return True


def stop_pid(pid: int, marker: str, grace: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds; only if the PID still runs one of our commands."""
    if not is_ours(pid, marker):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        _reap(pid)
        if not alive(pid):
            return
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    for _ in range(100):
        _reap(pid)
        if not alive(pid):
            return
        time.sleep(0.05)


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def tail(path: Path, lines: int = 40) -> str:
    """The last lines of a daemon's log, for the error that says why it did not come up."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
