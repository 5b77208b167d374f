"""The `local` transport: reach another pod of a `trainhook local` run, as `kubectl exec` reaches a cluster's.

A local run keeps every pod's sandbox in RUN_DIR/pods/POD/sandbox.json (trainhook.local.pods), and
`LocalPod.entry_argv` is the way into a pod: its network namespace, hosts file, hostname, mounts and the
container's environment. The run directory is found from TRAINHOOK_LOCAL_RUN_DIR when the runner sets it, else
from this pod's own /etc/hosts, which a local run bind-mounts from RUN_DIR/pods/POD/hosts
(/proc/self/mountinfo names the source). In a cluster neither exists, so detection never fires there.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:
    from trainhook.local.pods import LocalPod

TH_LOCAL_RUN_DIR = "TRAINHOOK_LOCAL_RUN_DIR"
SANDBOX_FILE = "sandbox.json"  # trainhook.local.pods.SANDBOX_FILE, without importing the runner in a cluster
MOUNTINFO = Path("/proc/self/mountinfo")
_ESCAPE = re.compile(r"\\([0-7]{3})")


class LocalPodError(Exception):
    """The target is not a pod of this local run; the message says what exists."""


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal (\\040)."""
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def bind_sources(target: str, mountinfo: str) -> list[Path]:
    """Host paths that may be the source of the mount at `target`: its root within the source filesystem,
    joined to each mount point of that filesystem (a file on / or on a tmpfs at /tmp, say)."""
    entries = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) >= 5:
            entries.append((fields[2], _unescape(fields[3]), _unescape(fields[4])))  # dev, root, mount point
    found = [(dev, root) for dev, root, point in entries if point == target]
    if not found:
        return []
    dev, root = found[-1]  # the top mount wins
    candidates = []
    for other_dev, other_root, point in entries:
        if other_dev != dev or point == target:
            continue
        prefix = other_root.rstrip("/")
        if root == other_root or root.startswith(prefix + "/"):
            candidates.append(Path(point) / root[len(prefix):].lstrip("/"))
    return candidates


def run_dir_from_hosts(mountinfo_text: str | None = None) -> Path | None:
    if mountinfo_text is None:
        try:
            mountinfo_text = MOUNTINFO.read_text()
        except OSError:
            return None
    for source in bind_sources("/etc/hosts", mountinfo_text):
        if (source.parent / SANDBOX_FILE).is_file():
            return source.parent.parent.parent  # RUN_DIR/pods/POD/hosts
    return None


def local_run_dir(env: Mapping[str, str]) -> Path | None:
    """The run directory of the `trainhook local` run this process is a pod of, or None."""
    explicit = env.get(TH_LOCAL_RUN_DIR, "").strip()
    if explicit:
        return Path(explicit)
    return run_dir_from_hosts()


def load_pods(run_dir: Path) -> list[LocalPod]:
    from trainhook.local.pods import LocalPod
    return [LocalPod.load(path) for path in sorted((run_dir / "pods").glob(f"*/{SANDBOX_FILE}"))]


def find_pod(run_dir: Path, host: str) -> LocalPod:
    """The pod whose hostname (or name) is the first label of `host`, e.g. `mpi-worker-1.mpi`."""
    label = host.split(".", 1)[0]
    pods = load_pods(run_dir)
    for pod in pods:
        if label in (pod.hostname, pod.name):
            return pod
    names = ", ".join(p.hostname for p in pods) or "none"
    raise LocalPodError(f"no pod with hostname {label!r} in the local run {run_dir} (pods: {names})")


def exec_argv(pod: LocalPod, command: list[str]) -> tuple[list[str], dict[str, str]]:
    """The command line and environment that run `command` in the pod's training container (kubectl exec)."""
    spec = pod.training_container
    return pod.entry_argv(spec, command), dict(spec.env)


def exec_in(run_dir: Path, host: str, command: list[str]) -> None:
    """Replace this process with `command` running inside the local pod `host` (never returns)."""
    argv, env = exec_argv(find_pod(run_dir, host), command)
    os.execvpe(argv[0], argv, env)
