"""The `local` transport: reach another pod of a `trainhook local` run, as `kubectl exec` reaches a cluster's.

The way into a local pod (its network namespace, hosts file, hostname, mounts and the container's environment)
is the runner's own `kubectl exec`: the script RUN_DIR/podexec that `trainhook local` writes when a run starts
(`python -m trainhook.local.podexec RUN_DIR POD -- CMD`, with the runner's Python). The launcher execs it rather
than importing trainhook.local, because the launcher runs delivered into the pod on the image's Python with the
standard library only (deliver.py), where trainhook.local does not exist. What the launcher does itself is find
the pod: mpirun names hosts by hostname, and a Job's pod is not named after its hostname, so the pods' sandbox
files (RUN_DIR/pods/POD/sandbox.json, plain JSON) are read for their `name` and `hostname`.

The run directory is found from TRAINHOOK_LOCAL_RUN_DIR when the runner sets it, else from this pod's own
/etc/hosts, which a local run bind-mounts from RUN_DIR/pods/POD/hosts (/proc/self/mountinfo names the source).
In a cluster neither exists, so detection never fires there.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Mapping

from trainhook.gang.keys import TH_LOCAL_RUN_DIR  # defined in keys.py; used (and read by kubexec) from here

SANDBOX_FILE = "sandbox.json"  # trainhook.local.pods.SANDBOX_FILE
PODEXEC = "podexec"  # RUN_DIR/podexec, written by trainhook.local.podexec.install
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


def pod_names(run_dir: Path) -> list[tuple[str, str]]:
    """(name, hostname) of every pod of the local run, from its sandbox file."""
    pods = []
    for path in sorted((run_dir / "pods").glob(f"*/{SANDBOX_FILE}")):
        try:
            sandbox = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # a pod still being prepared
        pods.append((sandbox.get("name") or path.parent.name, sandbox.get("hostname") or path.parent.name))
    return pods


def local_pod_name(run_dir: Path, host: str) -> str:
    """The name of the pod whose hostname (or name) is the first label of `host`, e.g. `mpi-worker-1.mpi`."""
    label = host.split(".", 1)[0]
    pods = pod_names(run_dir)
    for name, hostname in pods:
        if label in (hostname, name):
            return name
    names = ", ".join(hostname for _, hostname in pods) or "none"
    raise LocalPodError(f"no pod with hostname {label!r} in the local run {run_dir} (pods: {names})")


def exec_argv(run_dir: Path, pod: str, command: list[str]) -> list[str]:
    """The runner's `kubectl exec` for `command` in the pod's training container."""
    return [str(run_dir / PODEXEC), pod, "--", *command]


def exec_in(run_dir: Path, host: str, command: list[str]) -> None:
    """Replace this process with `command` running inside the local pod `host` (never returns)."""
    argv = exec_argv(run_dir, local_pod_name(run_dir, host), command)
    if not os.access(argv[0], os.X_OK):
        raise LocalPodError(f"the local run {run_dir} has no {argv[0]} (written by `trainhook local` when a run "
                            f"starts; is this trainhook local older than the launcher?)")
    os.execv(argv[0], argv)
