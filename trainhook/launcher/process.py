"""The launcher's process toolkit: how the in-pod commands run a training command as a well-behaved child.

Why it exists apart from the commands: `run` (run.py), the gang-aware member (gang_run.py, ending.py) and the MPI
commands all start, signal, wait for and reap processes the same way, and keeping that here lets every command
import it without importing another command (tests/launcher/test_launcher_imports.py keeps launcher/ free of cycles).

As a container's PID 1, a Python or shell training script gets no default signal handling (the kernel drops
SIGTERM to PID 1 unless it installs a handler, so `kubectl delete` waits out the grace period and SIGKILLs), and
nobody reaps the zombies left by its dataloader workers' orphans. `run_command` forwards the usual signals to the
child, reaps orphans when it is PID 1, and returns the child's code, or 128+N when the child dies of signal N, as a
shell does, because the contract reads 128 and above as retryable and 1-127 as permanent. `Training` is one
attempt of the gang-aware launcher: the same promises, in its own process group, with the last lines of its output
kept (output_tail.Tee) so the gang's outcome can carry them when the pods are gone.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading

from trainhook.launcher.child import Child, spawn
from trainhook.launcher.output_tail import Tee

TYPE_CHECKING = False  # typing's own, without importing typing (trainhook/launcher/__init__.py says why)
if TYPE_CHECKING:
    import subprocess
    from typing import Callable, Mapping, Sequence, Union

    Started = Union[Child, subprocess.Popen]  # mpi/launch.py's orted is a Popen

# Signals a pod's command should see: Kubernetes' stop (TERM), a terminal's (INT, HUP), and the USR pair that
# schedulers and checkpointing code use for "save now".
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
EXIT_CANNOT_EXECUTE, EXIT_NOT_FOUND = 126, 127  # a shell's codes for a command it cannot start


def exit_code(status: int) -> int:
    """A wait status as a shell reports it: the exit code, or 128+N for death by signal N."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def returncode(status: int) -> int:
    """A wait status as Popen.returncode reports it (-N for signal N): os.waitstatus_to_exitcode, which Python
    3.8 lacks (the launcher runs on the image's own Python)."""
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
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
    For a thread other than the main one (Training's waiter): the main thread, where signals are handled, waits
    with SignalForwarder.wait, because a blocking waitpid there can miss a signal.
    """
    status = _reap_until(pid, reap_all, 0)
    assert status is not None  # a blocking waitpid returns only with a child
    return status


def collect(pid: int, reap_all: bool) -> int | None:
    """`pid`'s wait status if it has exited, else None, without blocking; as PID 1 (`reap_all`) every exited
    process is collected on the way, as in wait_for."""
    return _reap_until(pid, reap_all, os.WNOHANG)


def _reap_until(pid: int, reap_all: bool, flags: int) -> int | None:
    """waitpid with `flags` until it returns `pid` (its status) or nothing more has exited (None, WNOHANG only)."""
    while True:
        reaped, status = os.waitpid(-1 if reap_all else pid, flags)
        if reaped == pid:
            if reap_all:
                reap_exited()
            return status
        if reaped == 0:
            return None


class SignalForwarder:
    """Forwards the FORWARDED signals to a child that may not exist yet: one arriving before the child does is
    delivered as soon as it exists, so a quick `kubectl delete` is never lost. A context manager: the previous
    handlers come back on exit. Must be entered on the main thread (Python delivers signals there).

    Wait for the child with `wait`, not a blocking waitpid: Python runs a signal's handler between bytecodes, so a
    signal that lands after the last check and before the waitpid call blocks is left unhandled until the child
    exits on its own (a `kubectl delete` then waits out the grace period). `wait` sleeps in select on the wakeup
    pipe, to which every caught signal writes a byte, SIGCHLD included, so no signal waits for the child."""

    def __init__(self) -> None:
        self.child: Started | None = None
        self.pending: list[int] = []
        self.previous: dict = {}
        self.previous_wakeup = -1
        self.wake_read = self.wake_write = -1

    def __call__(self, signum: int, _frame: object = None) -> None:
        if self.child is None:
            self.pending.append(signum)
            return
        try:
            os.kill(self.child.pid, signum)
        except ProcessLookupError:
            pass  # it exited already; its status is being collected

    def attach(self, child: Started) -> None:
        self.child = child
        for signum in self.pending:
            self(signum)

    def wait(self, pid: int, reap_all: bool) -> int:
        """Block until `pid` exits and return its wait status, running the handlers of signals as they come (see
        the class); as PID 1 (`reap_all`) every other exiting process is collected on the way."""
        while True:
            status = collect(pid, reap_all)
            if status is not None:
                return status
            select.select([self.wake_read], [], [])
            try:
                while os.read(self.wake_read, 512):
                    pass
            except BlockingIOError:
                pass

    def __enter__(self) -> SignalForwarder:
        self.wake_read, self.wake_write = os.pipe()
        for fd in (self.wake_read, self.wake_write):
            os.set_blocking(fd, False)
        self.previous = {signum: signal.signal(signum, self) for signum in FORWARDED}
        self.previous[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
        self.previous_wakeup = signal.set_wakeup_fd(self.wake_write)
        return self

    def __exit__(self, *exc: object) -> None:
        signal.set_wakeup_fd(self.previous_wakeup)
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        os.close(self.wake_read)
        os.close(self.wake_write)


def run_command(argv: Sequence[str], env: Mapping[str, str] | None = None) -> int:
    """Run `argv` as a child with signals forwarded; return its exit code (128+N if killed by signal N)."""
    with SignalForwarder() as forward:
        try:
            child = spawn(argv, env)
        except FileNotFoundError:
            print(f"trainhook-launch: command not found: {argv[0]}", file=sys.stderr, flush=True)
            return EXIT_NOT_FOUND
        except OSError as e:  # not executable, a directory, a bad interpreter line
            print(f"trainhook-launch: cannot execute {argv[0]}: {e.strerror or e}", file=sys.stderr, flush=True)
            return EXIT_CANNOT_EXECUTE
        forward.attach(child)
        status = forward.wait(child.pid, reap_all=os.getpid() == 1)
        child.returncode = returncode(status)
        return exit_code(status)


class Training:
    """One attempt's training command for the gang-aware launcher: started in its own process group (so a stop
    can take every process it started, a dataloader's as much as torchrun's workers), collected on a waiter
    thread that reports the exit code (128+N for signal N) through `on_exit`. Signals are sent by the caller."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], on_exit: Callable[[int], None]):
        self.argv, self.env, self.on_exit = list(argv), dict(env), on_exit
        self.proc: Child | None = None
        self.tee: Tee | None = None
        self.cause = ""  # why it could not start, in words (the outcome's reason carries it)

    def start(self) -> int | None:
        """Start the command; None when it runs, else the shell's code for why it could not (127, 126), with
        the reason in `cause`. Its stdout and stderr go through a Tee: on to the container's, unchanged and at
        once, and the last lines kept (`tail()`)."""
        tee = Tee()
        out, err = tee.child_fds()
        try:
            # Its own process group (not session: a container's processes share its session, which is how
            # `trainhook local` ends a container whole, as a runtime does).
            self.proc = spawn(self.argv, self.env, stdout=out, stderr=err, own_group=True)
        except FileNotFoundError:
            tee.abandon()
            self.cause = f"command not found: {self.argv[0]}"
            print(f"trainhook-launch: {self.cause}", file=sys.stderr, flush=True)
            return EXIT_NOT_FOUND
        except OSError as e:
            tee.abandon()
            self.cause = f"cannot execute {self.argv[0]}: {e.strerror or e}"
            print(f"trainhook-launch: {self.cause}", file=sys.stderr, flush=True)
            return EXIT_CANNOT_EXECUTE
        tee.started()
        self.tee = tee
        threading.Thread(target=self._wait, daemon=True, name="training-waiter").start()
        return None

    def tail(self) -> str:
        """The last lines the command printed (output_tail's bounds); "" before it ran."""
        return self.tee.tail.text() if self.tee is not None else ""

    def _wait(self) -> None:
        assert self.proc is not None
        status = wait_for(self.proc.pid, reap_all=os.getpid() == 1)
        self.proc.returncode = returncode(status)
        self.kill_group()  # what the command left behind goes with it, so no stale peer outlives an attempt
        if self.tee is not None:
            self.tee.finish()  # its last lines are in the tail before its exit is reported
        self.on_exit(exit_code(status))

    def signal(self, signum: int) -> None:
        """Send `signum` to the command itself (it forwards to its workers, as torchrun does)."""
        if self.proc is not None and self.proc.returncode is None:
            try:
                os.kill(self.proc.pid, signum)
            except ProcessLookupError:
                pass

    def kill_group(self) -> None:
        """SIGKILL every process the command started: its process group, and the processes below it that left
        the group (torchrun starts each worker in a session of its own, so the group alone misses them). While
        the command lives they are found by their parent links; once it has exited they were handed to the
        container's PID 1, which is this launcher in a pod, and then every other process in the container is
        what this attempt left behind (the launcher starts nothing else while an attempt runs)."""
        if self.proc is None:
            return
        if self.proc.returncode is None:
            strays = descendants(self.proc.pid)
        else:
            strays = descendants(os.getpid()) if os.getpid() == 1 else []
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for pid in strays:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def descendants(pid: int) -> list[int]:
    """Every process below `pid` now, by the parent links in /proc (whatever their group or session); [] where
    /proc cannot be read."""
    children: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rfind(b")") + 2:].split()  # after the command's name, which may hold spaces
        if len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found
