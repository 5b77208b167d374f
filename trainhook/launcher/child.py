"""Start a command as a child process the way subprocess.Popen does, without importing subprocess.

Why not Popen: every launcher start runs one training command, and `subprocess` (with the `locale` it imports)
was 1-2.5 ms of each start's ~40 ms of CPU (issue 32: a gang's launchers start together on the same cores;
bench/launcher_start.py). The launcher uses Popen for nothing but a pid: it collects the child's status itself
(process.py: as PID 1 it must reap everything), and signals it with os.kill.

`spawn` keeps what Popen promises a command: PATH is searched in the environment the command gets (Popen's rule,
not posix_spawnp's, which reads the launcher's own), with Popen's errors for a command that is not there
(FileNotFoundError) or may not run (PermissionError, or what exec says, e.g. a bad interpreter line); signals
Python ignores (SIGPIPE, SIGXFSZ) are back to their defaults; no descriptor of the launcher's other than 0, 1 and 2
is inherited (Python makes its own non-inheritable; any others it was started with are closed, as close_fds
does). The standard library only, Python 3.8 or newer (os.posix_spawn): this runs in the users' images.
"""

from __future__ import annotations

import errno
import os
import signal

TYPE_CHECKING = False  # typing's own, without importing typing (trainhook/launcher/__init__.py says why)
if TYPE_CHECKING:
    from typing import Mapping, Sequence

# Popen's restore_signals: what Python sets to SIG_IGN at its start, which a command would otherwise inherit.
RESTORED = tuple(getattr(signal, name) for name in ("SIGPIPE", "SIGXFSZ") if hasattr(signal, name))


class Child:
    """A started command: its pid, and its Popen-style returncode once collected (-N for signal N), which the
    caller sets, as it collects the status itself."""

    __slots__ = ("pid", "returncode")

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None


def resolve(program: str, env: Mapping[str, str]) -> str:
    """The file Popen would run for `program`: itself when it names a directory, else the first executable file
    of that name in the command's PATH (an empty entry is the working directory). FileNotFoundError when there
    is none, PermissionError when the only ones found may not be run. Looked up here rather than by exec
    attempts, so that an old C library whose posix_spawn cannot report a failed exec still finds the command."""
    if os.path.dirname(program):
        return program
    denied = False
    for directory in os.get_exec_path(env):
        path = os.path.join(directory, program)
        if os.path.isfile(path):
            if os.access(path, os.X_OK):
                return path
            denied = True
    code = errno.EACCES if denied else errno.ENOENT
    raise OSError(code, os.strerror(code), program)


def inherited_extras() -> list[int]:
    """Descriptors above 2 that a child would inherit (none that Python opened: it makes them non-inheritable)."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return []
    extras = []
    for name in names:
        fd = int(name)
        try:
            if fd > 2 and os.get_inheritable(fd):
                extras.append(fd)
        except OSError:  # the listing's own descriptor, closed by now
            continue
    return extras


def spawn(argv: Sequence[str], env: Mapping[str, str] | None = None, stdout: int | None = None,
          stderr: int | None = None, own_group: bool = False) -> Child:
    """Start `argv` with `env` (this process's when None), its stdout and stderr on the given descriptors (else
    ours), in a process group of its own when `own_group`. Raises what Popen raises when it cannot start."""
    argv = list(argv)
    env = dict(os.environ if env is None else env)
    actions: list[tuple] = [(os.POSIX_SPAWN_CLOSE, fd) for fd in inherited_extras()]
    actions += [(os.POSIX_SPAWN_DUP2, fd, target) for fd, target in ((stdout, 1), (stderr, 2)) if fd is not None]
    options: dict = {"file_actions": actions, "setsigdef": RESTORED}
    if own_group:
        options["setpgroup"] = 0
    return Child(os.posix_spawn(resolve(argv[0], env), argv, env, **options))
