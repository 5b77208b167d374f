"""Where a gang start's CPU goes on the real node: the node's own processes and the pods' cgroups, before and after.

On a 2-core node a gang's start is bounded by CPU, not by waiting: 32 launchers, 32 container starts and the API
calls behind them share two cores. Time alone cannot say whose work it was; CPU seconds by part can. A part is:
- `gang_pods`: the gang's pods' own cgroups (their processes: trainhook's launcher and the training; by hand, the
  training only); a pod's cgroup starts at zero, so its usage at the end is its share;
- `other_pods`: every other pod of the node over the same window (the webhook's replicas: the notary's work);
- the node's processes, found by the node's state directory in their command line (another cluster's API server
  started by a test elsewhere on the machine is not counted): kubelet, containerd and its shims (with the runc
  calls they reaped), the API server, etcd, the controller manager and scheduler, kube-proxy, the cluster DNS.

A process that starts during the window counts from zero; one that ends during it is lost, except what its parent
reaped (cutime). bench/node_start_scale.py takes a snapshot before `kubectl apply` and after the last rank printed.
"""

from __future__ import annotations

import os
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")
CPUACCT = Path("/sys/fs/cgroup/cpuacct")
GROUPS = (("containerd-shim", "containerd"), ("containerd", "containerd"), ("kubelet", "kubelet"),
          ("kube-apiserver", "apiserver"), ("etcd", "etcd"), ("kube-controller", "controllers"),
          ("kube-scheduler", "controllers"), ("kube-proxy", "kube-proxy"))


def _group(pid: int, state_dir: str) -> str | None:
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None
    if state_dir not in args:
        return None
    if "cluster_dns.py" in args:
        return "dns"
    return next((group for prefix, group in GROUPS if comm.startswith(prefix)), None)


def _cpu(pid: int) -> float | None:
    """utime + stime + cutime + cstime of `pid`, seconds (children it reaped included: runc under a shim)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return sum(int(v) for v in fields[11:15]) / TICK


def processes(state_dir: str) -> dict[int, tuple[str, float]]:
    """{pid: (part, CPU seconds so far)} for the node's own processes."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            group = _group(int(entry), state_dir)
            cpu = _cpu(int(entry)) if group else None
            if group and cpu is not None:
                out[int(entry)] = (group, cpu)
    return out


def pod_cgroups(cgroup_root: str) -> dict[str, float]:
    """{pod uid: CPU seconds} for every pod cgroup under the node's kubepods, and '' for kubepods as a whole."""
    base = CPUACCT / cgroup_root.strip("/") / "kubepods"
    out = {"": _usage(base)}
    for qos in (base, base / "burstable", base / "besteffort"):
        for pod in qos.glob("pod*"):
            out[pod.name[len("pod"):]] = _usage(pod)
    return out


def _usage(cgroup: Path) -> float:
    try:
        return int((cgroup / "cpuacct.usage").read_text()) / 1e9
    except (OSError, ValueError):
        return 0.0


def snapshot(state_dir: str, cgroup_root: str) -> dict:
    return {"processes": processes(state_dir), "pods": pod_cgroups(cgroup_root)}


def parts(before: dict, after: dict, gang_uids: set[str]) -> dict[str, float]:
    """CPU seconds by part between two snapshots; `gang_uids`: the gang's pods (read before they are deleted)."""
    out: dict[str, float] = {}
    for pid, (group, cpu) in after["processes"].items():
        old = before["processes"].get(pid)
        out[group] = out.get(group, 0.0) + cpu - (old[1] if old and old[0] == group else 0.0)
    gang = sum(after["pods"].get(uid, 0.0) - before["pods"].get(uid, 0.0) for uid in gang_uids)
    out["gang_pods"] = gang
    out["other_pods"] = after["pods"][""] - before["pods"][""] - gang
    out["total"] = sum(out.values())
    return {part: round(seconds, 2) for part, seconds in sorted(out.items())}
