"""`kubectl exec` for local pods: run a command inside a running pod of a `trainhook local` run.

    python -m trainhook.local.podexec RUN_DIR POD [-c CONTAINER] -- CMD ARGS...

The pod's sandbox is read from RUN_DIR/pods/POD/sandbox.json (written when the run starts), and the command
enters it exactly as the pod's own containers did (`LocalPod.entry_argv`), with the container's environment.
Needs root, like the run itself. Exits with the command's exit code.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from trainhook.local.pods import SANDBOX_FILE, LocalPod


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
