"""`trainhook-launch run -- CMD ARGS`: run the training command as a well-behaved child of the container.

Why a wrapper at all: as a container's PID 1, a Python or shell training script gets no default signal
handling (the kernel drops SIGTERM to PID 1 unless it installs a handler, so `kubectl delete` waits out the
grace period and SIGKILLs), and nobody reaps the zombies left by its dataloader workers' orphans. `run`
forwards the usual signals to the child, reaps orphans when it is PID 1, and exits with the child's code, or
128+N when the child dies of signal N, as a shell does, because the contract reads 128 and above as
retryable and 1-127 as permanent.

`run_command` is the seam that gang-wide completion and failure coordination will wrap.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Mapping, Sequence

# Signals a pod's command should see: Kubernetes' stop (TERM), a terminal's (INT, HUP), and the USR pair that
# schedulers and checkpointing code use for "save now".
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
EXIT_CANNOT_EXECUTE, EXIT_NOT_FOUND = 126, 127  # a shell's codes for a command it cannot start


def exit_code(status: int) -> int:
    """A wait status as a shell reports it: the exit code, or 128+N for death by signal N."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def reap_exited() -> None:
    """Collect every child that has already exited (orphans re-parented to us), without blocking."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def wait_for(pid: int, reap_all: bool) -> int:
    """Block until `pid` exits and return its wait status.

    As PID 1 (`reap_all`) every exiting process in the container is ours to collect, so we wait for any child
    and keep going until it is `pid`; otherwise we wait for `pid` only, leaving other children to their owners.
    Signal handlers run while we block (PEP 475 retries the wait after them).
    """
    while True:
        reaped, status = os.waitpid(-1 if reap_all else pid, 0)
        if reaped == pid:
            if reap_all:
                reap_exited()
            return status


def run_command(argv: Sequence[str], env: Mapping[str, str] | None = None) -> int:
    """Run `argv` as a child with signals forwarded; return its exit code (128+N if killed by signal N).

    Must be called from the main thread (Python delivers signals there). A signal that arrives before the
    child exists is delivered to it as soon as it does, so a quick `kubectl delete` is never lost.
    """
    child: subprocess.Popen[bytes] | None = None
    pending: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        if child is None:
            pending.append(signum)
            return
        try:
            os.kill(child.pid, signum)
        except ProcessLookupError:
            pass  # it exited already; its status is being collected

    previous = {signum: signal.signal(signum, forward) for signum in FORWARDED}
    try:
        try:
            child = subprocess.Popen(list(argv), env=None if env is None else dict(env))
        except FileNotFoundError:
            print(f"trainhook-launch: command not found: {argv[0]}", file=sys.stderr, flush=True)
            return EXIT_NOT_FOUND
        except OSError as e:  # not executable, a directory, a bad interpreter line
            print(f"trainhook-launch: cannot execute {argv[0]}: {e.strerror or e}", file=sys.stderr, flush=True)
            return EXIT_CANNOT_EXECUTE
        for signum in pending:
            forward(signum, None)
        status = wait_for(child.pid, reap_all=os.getpid() == 1)
        child.returncode = os.waitstatus_to_exitcode(status)  # collected here: Popen must not wait again
        return exit_code(status)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
