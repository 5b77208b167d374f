"""A gang's logs for `trainhook logs` and the SDK's `get_job_logs`, including a gang whose pods are gone.

A finished StatefulSet gang is scaled to zero: its pods are deleted, and their logs with them, sometimes before a
follower that polls could read them (a gang that starts and ends between two polls), or while a reader is
reading (`get_job_logs` right after `wait_for_job` races the scale-down). So a pod whose log cannot be read
because the pod went is *missed*, not an error: the reader then takes the last lines the notary kept with the
outcome (trainhook.dev/last-lines: the deciding rank's and rank 0's, launcher/output_tail.py's bounds), waiting a
little for the record when the pods went first. A container still initializing (`PodInitializing`) is waited
for, never read too early.

I/O on a trainhook.cluster.client.Cluster; what the answers mean is trainhook.cluster.status's.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from trainhook.cluster.client import Cluster, ClusterError
from trainhook.cluster.status import GangState, KeptLines, container_started, gang_state, pod_rank

# What a kubelet answers in place of a log when the container is being removed: a 200 whose body is one of these
# lines (v1.20 with containerd, both seen on the node: the first once the runtime has forgotten the container, the
# second once the container's log file is deleted but the runtime still names it), or the KUBELET_LOST line at the
# end of a followed stream.
KUBELET_NO_LOG = ("unable to retrieve container logs for ", "failed to try resolving symlinks in path ")
KUBELET_LOST = "rpc error: code = NotFound desc = an error occurred when try to find container"
POLL = 1.0  # seconds between two looks at a pod that has not started, or a gang without pods
RECORD_WAIT = 15.0  # how long a reader whose pods went waits for the outcome (and its kept lines) to be recorded


def state_of(cluster: Cluster, name: str) -> tuple[GangState, list[dict]]:
    objects = cluster.gang(name)
    return gang_state(name, cluster.namespace, objects.workloads, objects.pods), objects.pods


def in_rank_order(pods: list[dict]) -> list[dict]:
    return sorted(pods, key=lambda p: (pod_rank(p) is None, pod_rank(p) or 0, p["metadata"]["name"]))


def wait_for_pods(cluster: Cluster, name: str, timeout: float | None = None) -> tuple[GangState, list[dict]]:
    """The gang once it has a pod for each of its members, or is finished (a follower started before the pods
    exist, e.g. right after create_job: a controller creates a gang's pods one call at a time, so returning at the
    first pod left out the ranks whose pods came a moment later, issue 33); returns at once for a gang that does
    not exist, and after `timeout` seconds whatever it is."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        state, pods = state_of(cluster, name)
        if (pods and len(pods) >= state.size) or state.finished or state.outcome == "NotFound":
            return state, pods
        if deadline is not None and time.monotonic() >= deadline:
            return state, pods
        time.sleep(POLL)


def read_pod_log(cluster: Cluster, pod: dict, container: str, follow: bool, tail: int | None,
                 emit: Callable[[str], None]) -> bool:
    """Stream one pod's log into `emit`, line by line; with `follow`, first wait (through PodInitializing) for
    the container to start. False when the pod went (deleted, or being deleted) before its log could be read;
    ClusterError for any other failure."""
    name = pod["metadata"]["name"]
    while follow and not container_started(pod, container):
        time.sleep(POLL)
        current = cluster.read_pod(name)
        if current is None:
            return False
        pod = current
        if current["metadata"].get("deletionTimestamp") and not container_started(current, container):
            return False  # deleted before it ever ran
    held = None  # a kubelet line saying the container went, shown only when more of the log follows it
    try:
        for number, line in enumerate(cluster.log_lines(name, container, follow, tail)):
            if number == 0 and line.startswith(KUBELET_NO_LOG) and going(cluster, name):
                return False  # answered with 200 and this line instead of the log: the container was removed
            if held is not None:
                emit(held)
                held = None
            if line.startswith(KUBELET_LOST):
                held = line
                continue
            emit(line)
    except ClusterError:
        if going(cluster, name):
            return False  # pod not found, or an error reading a container being removed: it went while we read
        raise
    if held is not None and not going(cluster, name):
        emit(held)
    return True


def going(cluster: Cluster, name: str) -> bool:
    """Whether the pod is gone or being deleted (a finished StatefulSet gang's scale to zero)."""
    current = cluster.read_pod(name)
    return current is None or bool(current["metadata"].get("deletionTimestamp"))


def kept_for(cluster: Cluster, name: str, wait: float = RECORD_WAIT) -> tuple[GangState, tuple[KeptLines, ...]]:
    """The kept last lines of a gang whose pods went, waiting up to `wait` seconds for the outcome to be recorded
    (the scale to zero follows the record, but a reader may see the pods go before the record is read back); a
    gang deleted whole has nothing kept."""
    deadline = time.monotonic() + wait
    while True:
        state, _ = state_of(cluster, name)
        if state.recorded is not None or state.outcome == "NotFound" or time.monotonic() >= deadline:
            return state, state.recorded.kept if state.recorded else ()
        time.sleep(POLL)


def kept_of_pod(kept: tuple[KeptLines, ...], pod: dict) -> KeptLines | None:
    """The kept lines of `pod`, matched by name (the notary's), else by its rank."""
    name, rank = pod["metadata"]["name"], pod_rank(pod)
    return next((k for k in kept if k.pod == name), None) or \
        next((k for k in kept if not k.pod and k.rank == rank), None)


def kept_label(kept: KeptLines) -> str:
    return kept.pod or f"rank-{kept.rank}"


def notice(kept: KeptLines) -> str:
    count = len(kept.lines.splitlines())
    return (f"[{kept_label(kept)}] (its pod is gone: the last {count} lines of rank {kept.rank}, kept with the "
            f"gang's outcome)")
