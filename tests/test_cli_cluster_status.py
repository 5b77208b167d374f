"""How `status`, `list` and `submit --wait` read a gang: pure functions over the objects the API server returns
(pods in every phase a kubelet reports, which the test control plane, having no kubelet, cannot produce)."""

from __future__ import annotations

import pytest

from trainhook import keys
from trainhook.gang_status import changes, container_started, format_list, format_status, gang_state, \
    parse_phase, pod_state, progress
from trainhook.render import EXIT_CODE, PHASE, PHASE_REASON, PHASE_TIME


def pod(name: str, rank: int, phase: str = "Running", restarts: int = 0, role: str = "worker",
        waiting: str = "", terminated: str = "", ready: bool = True, scheduled: bool = True) -> dict:
    state: dict = {"running": {"startedAt": "2025-01-01T00:00:00Z"}}
    if waiting:
        state = {"waiting": {"reason": waiting}}
    if terminated:
        state = {"terminated": {"reason": terminated, "exitCode": 1}}
    status: dict = {"phase": phase,
                    "containerStatuses": [{"name": "trainer", "ready": ready, "restartCount": restarts,
                                           "state": state}]}
    if not scheduled:
        status = {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                                                       "reason": "Unschedulable"}]}
    return {"metadata": {"name": name, "labels": {keys.JOB_NAME: "g", keys.ROLE: role, keys.FRAMEWORK: "pytorch"}},
            "spec": {"containers": [{"name": "trainer", "env": [{"name": keys.TH_RANK, "value": str(rank)},
                                                                {"name": keys.TH_REPLICAS, "value": "worker=2"}]}]},
            "status": status}


def sts(replicas: int = 2, phase: str | None = None, **recorded: str) -> dict:
    meta: dict = {"name": "g", "labels": {keys.FRAMEWORK: "pytorch", keys.JOB_NAME: "g", keys.ROLE: "worker"}}
    if phase:
        meta["annotations"] = {PHASE: phase, **recorded}
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": meta, "spec": {"replicas": replicas}}


def test_pods_are_listed_in_rank_order_with_their_state():
    state = gang_state("g", "ns", [sts()], [pod("g-1", 1, restarts=2, waiting="CrashLoopBackOff", ready=False),
                                           pod("g-0", 0)])
    assert [(p.name, p.rank, p.phase, p.ready, p.restarts, p.reason) for p in state.pods] == [
        ("g-0", 0, "Running", "1/1", 0, ""), ("g-1", 1, "Running", "0/1", 2, "CrashLoopBackOff")]
    assert (state.framework, state.shape, state.size, state.outcome) == ("pytorch", "worker=2", 2, "Running")
    assert format_status(state).splitlines() == [
        "gang g (pytorch, worker=2) in ns: Running",
        "workloads: statefulset/g",
        "POD  ROLE    RANK  PHASE    READY  RESTARTS  REASON",
        "g-0  worker  0     Running  1/1    0         -",
        "g-1  worker  1     Running  0/1    2         CrashLoopBackOff"]


@pytest.mark.parametrize("workloads, pods, outcome, detail", [
    ([sts(phase="Succeeded at 2025-01-01T00:00:00Z: rank 0 exited 0")], [], "Succeeded",
     "Succeeded at 2025-01-01T00:00:00Z: rank 0 exited 0"),
    # as launcher/lifecycle.py records it: the phase, with its reason, exit code and time beside it
    ([sts(phase="Failed", **{PHASE_REASON: "g-1 (rank 1) exited 3", EXIT_CODE: "3",
                             PHASE_TIME: "2025-01-01T00:00:00Z"})],
     [pod("g-0", 0)], "Failed", "g-1 (rank 1) exited 3 (exit 3) at 2025-01-01T00:00:00Z"),
    ([sts(phase='{"phase": "Failed", "pod": "g-1", "exitCode": 3}')], [pod("g-0", 0)], "Failed",
     '{"phase": "Failed", "pod": "g-1", "exitCode": 3}'),
    ([sts()], [pod("g-0", 0, "Succeeded"), pod("g-1", 1, "Succeeded")], "Succeeded", "every pod succeeded"),
    ([sts()], [pod("g-0", 0), pod("g-1", 1, "Failed", terminated="OOMKilled")], "Failed", "g-1 OOMKilled"),
    ([sts()], [pod("g-0", 0), pod("g-1", 1, "Pending", waiting="ContainerCreating")], "Starting",
     "1/2 pods running"),
    ([sts()], [pod("g-0", 0, scheduled=False)], "Pending", "1/2 pods created"),
    ([], [], "NotFound", ""),
    ([{"kind": "Job", "metadata": {"name": "g"}, "spec": {"completions": 2},
       "status": {"conditions": [{"type": "Complete", "status": "True"}]}}], [], "Succeeded", "every Job completed"),
    ([{"kind": "Job", "metadata": {"name": "g"}, "spec": {"completions": 2},
       "status": {"conditions": [{"type": "Failed", "status": "True"}]}}], [], "Failed", "a Job of the gang failed"),
])
def test_the_outcome(workloads, pods, outcome, detail):
    state = gang_state("g", "ns", workloads, pods)
    assert (state.outcome, state.detail) == (outcome, detail)


def test_an_unschedulable_pod_says_so():
    assert pod_state(pod("g-0", 0, scheduled=False)).reason == "Unschedulable"


def test_the_phase_annotation_is_read_as_json_or_text():
    assert parse_phase('{"phase": "Succeeded", "at": "t"}') == ("Succeeded", '{"phase": "Succeeded", "at": "t"}')
    assert parse_phase("Failed: g-1 exited 3") == ("Failed", "Failed: g-1 exited 3")
    assert parse_phase("Succeeded") == ("Succeeded", "Succeeded")


def test_wait_prints_only_what_changed():
    first = gang_state("g", "ns", [sts()], [pod("g-0", 0, "Pending", waiting="ContainerCreating"),
                                            pod("g-1", 1, "Pending", waiting="ContainerCreating")])
    assert changes(None, first) == ["  pod g-0 (rank 0): Pending (ContainerCreating)",
                                    "  pod g-1 (rank 1): Pending (ContainerCreating)",
                                    "gang g: Pending (2 Pending; 0 restarts)"]
    assert changes(first, first) == []
    second = gang_state("g", "ns", [sts()], [pod("g-0", 0), pod("g-1", 1, "Pending", waiting="ContainerCreating")])
    assert changes(first, second) == ["  pod g-0 (rank 0): Running",
                                      "gang g: Starting (1 Pending, 1 Running; 0 restarts)"]
    done = gang_state("g", "ns", [sts(phase="Succeeded: rank 0 exited 0")], [pod("g-0", 0), pod("g-1", 1)])
    assert progress(done) == "gang g: Succeeded (2 Running; 0 restarts): Succeeded: rank 0 exited 0"


def test_list_has_one_line_per_gang():
    states = [gang_state("g", "ns", [sts()], [pod("g-0", 0), pod("g-1", 1, restarts=1)])]
    assert format_list(states).splitlines() == ["NAME  FRAMEWORK  SHAPE     PODS  RESTARTS  OUTCOME",
                                                "g     pytorch    worker=2  2/2   1         Running"]
    assert format_list([]) == "no gangs"


def test_a_container_has_a_log_once_it_has_run():
    assert container_started(pod("g-0", 0), "trainer")
    assert not container_started(pod("g-0", 0, "Pending", waiting="ContainerCreating"), "trainer")
    assert not container_started(pod("g-0", 0), "other")
