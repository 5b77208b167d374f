"""`kubectl exec` for local pods: run a command inside a running pod of a `trainhook local` run.

    python -m trainhook.local.podexec RUN_DIR POD [-c CONTAINER] -- CMD ARGS...

The pod's sandbox is read from RUN_DIR/pods/POD/sandbox.json (written when the run starts), and the command
enters it exactly as the pod's own containers did (`LocalPod.entry_argv`), with the container's environment.
Needs root, like the run itself. Exits with the command's exit code.

`install` writes RUN_DIR/podexec when a run starts: this command with this Python and RUN_DIR filled in. The
launcher's `local` MPI transport execs it (launcher/mpi/local_transport.py), since the launcher runs delivered into the
pod with the standard library only and cannot import trainhook.local.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from trainhook.local.pods import SANDBOX_FILE, LocalPod


SCRIPT = "podexec"  # trainhook.launcher.mpi.local_transport.PODEXEC


def install(run_dir: Path) -> Path:
    """Write RUN_DIR/podexec: `RUN_DIR/podexec POD [-c CONTAINER] -- CMD` runs this module with this Python
    (-I: the pod's PYTHON* variables and working directory do not change which trainhook runs)."""
    path = run_dir / SCRIPT
    words = shlex.join([sys.executable, "-I", "-m", "trainhook.local.podexec", str(run_dir)])
    path.write_text(f"#!/bin/sh\n# Written by trainhook local: kubectl exec for the pods of this run.\n"
                    f"exec {words} \"$@\"\n")
    path.chmod(0o755)
    return path


def sandbox_path(run_dir: Path, pod: str) -> Path:
    return run_dir / "pods" / pod / SANDBOX_FILE


def load_pod(run_dir: Path, pod: str) -> LocalPod:
    path = sandbox_path(run_dir, pod)
    if not path.is_file():
        raise FileNotFoundError(f"no pod {pod!r} in run directory {run_dir} (missing {path})")
    return LocalPod.load(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainhook.local.podexec", description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("pod")
    parser.add_argument("-c", "--container", help="container whose mounts and environment to use")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("a command is required after --")
    try:
        pod = load_pod(args.run_dir, args.pod)
        spec = pod.container(args.container)
    except (FileNotFoundError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    argv_ = pod.entry_argv(spec, command)
    os.execvpe(argv_[0], argv_, spec.env)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
