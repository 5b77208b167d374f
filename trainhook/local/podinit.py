"""The last step into a local pod: runs inside the pod's network namespace and a fresh mount + UTS namespace.

    nsenter --net=/run/netns/NS unshare --mount --uts --propagation private -- \\
        python -I -S .../trainhook/local/podinit.py --hosts FILE --hostname H [--mount SRC:DST[:ro] ...] \\
            [--workdir D] -- CMD...

It bind-mounts the pod's hosts file over /etc/hosts and its volumes over their mount paths (mount points are
created when missing, which needs root), sets the hostname, changes directory and execs CMD with the
environment it was given. Only the standard library is used (so it runs as a script with -I -S: no
site-packages, no environment, a third of the start-up time of `-m`; every container of a local pod starts
through it), and nothing runs after the exec, so CMD is the process the supervisor signals and waits for. Errors
exit 127 (command not found) or 126 (setup failed), as a container runtime reports a container that cannot start.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import socket
import sys

MS_RDONLY, MS_REMOUNT, MS_BIND = 0x1, 0x20, 0x1000
EXIT_SETUP_FAILED, EXIT_NOT_FOUND = 126, 127


class SetupError(Exception):
    pass


def _libc() -> ctypes.CDLL:
    """The C library the interpreter is linked with (ctypes.util.find_library would run ldconfig for it)."""
    return ctypes.CDLL(None, use_errno=True)


def bind_mount(source: str, target: str, read_only: bool = False) -> None:
    """mount --bind SOURCE TARGET (then remount read-only when asked); the target is made when missing."""
    if not os.path.exists(source):
        raise SetupError(f"mount source {source} does not exist")
    if not os.path.exists(target):
        if os.path.isdir(source):
            os.makedirs(target, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(target) or "/", exist_ok=True)
            open(target, "a").close()
    libc = _libc()
    if libc.mount(source.encode(), target.encode(), None, MS_BIND, None) != 0:
        err = ctypes.get_errno()
        raise SetupError(f"bind mount {source} on {target}: {os.strerror(err)}")
    if read_only and libc.mount(None, target.encode(), None, MS_BIND | MS_REMOUNT | MS_RDONLY, None) != 0:
        err = ctypes.get_errno()
        raise SetupError(f"read-only remount of {target}: {os.strerror(err)}")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="podinit.py",
                                     description="Enter a local pod's view (hosts, volumes, hostname) and exec CMD.")
    parser.add_argument("--hosts", help="file bind-mounted over /etc/hosts")
    parser.add_argument("--hostname", help="UTS hostname to set")
    parser.add_argument("--mount", action="append", default=[], metavar="SRC:DST[:ro]", help="bind mount (repeat)")
    parser.add_argument("--workdir", help="directory to run CMD in")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    args = parser.parse_args(argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if not args.command:
        parser.error("a command is required after --")
    return args


def _split_mount(text: str) -> tuple[str, str, bool]:
    source, sep, rest = text.partition(":")
    if not sep or not source or not rest:
        raise SetupError(f"--mount {text!r}: expected SRC:DST or SRC:DST:ro")
    return (source, rest[:-3], True) if rest.endswith(":ro") else (source, rest, False)


def enter(args: argparse.Namespace) -> None:
    """Everything before the exec; raises SetupError with the reason."""
    if args.hosts:
        bind_mount(args.hosts, "/etc/hosts")
    for spec in args.mount:
        bind_mount(*_split_mount(spec))
    if args.hostname:
        socket.sethostname(args.hostname)
    if args.workdir:
        try:
            os.makedirs(args.workdir, exist_ok=True)
            os.chdir(args.workdir)
        except OSError as e:
            raise SetupError(f"working directory {args.workdir}: {e.strerror}") from e


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        enter(args)
    except (SetupError, OSError) as e:
        print(f"trainhook local: cannot start the container: {e}", file=sys.stderr, flush=True)
        return EXIT_SETUP_FAILED
    try:
        os.execvp(args.command[0], args.command)
    except FileNotFoundError:
        print(f"trainhook local: {args.command[0]!r}: executable file not found in $PATH", file=sys.stderr,
              flush=True)
        return EXIT_NOT_FOUND
    except OSError as e:
        print(f"trainhook local: exec {args.command[0]!r}: {e.strerror}", file=sys.stderr, flush=True)
        return EXIT_SETUP_FAILED
    return EXIT_SETUP_FAILED  # not reached: exec replaced the process


if __name__ == "__main__":
    sys.exit(main())
