"""How `status`, `list` and `submit --wait` read a gang: pure functions over the objects the API server returns
(pods in every phase a kubelet reports, which the test control plane, having no kubelet, cannot produce). The
outcome annotations are the launcher's own (tests/support/launcher_outcomes.py), never written by hand."""

from __future__ import annotations

import pytest

from launcher_outcomes import decided
from trainhook.gang import keys
from trainhook.cluster.status import changes, container_started, format_list, format_status, gang_state, pod_state, \
    progress
from trainhook.launcher.outcome import PHASE, Outcome

SUCCEEDED = decided("g", size=2)  # rank 0 exited 0
FAILED = decided("g", size=2, rank=1, code=3)


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


def sts(replicas: int = 2, outcome: Outcome | None = None, annotations: dict | None = None) -> dict:
    """The gang's StatefulSet; with `outcome`, carrying what the launcher records when the gang ends."""
    meta: dict = {"name": "g", "labels": {keys.FRAMEWORK: "pytorch", keys.JOB_NAME: "g", keys.ROLE: "worker"}}
    if outcome or annotations:
        meta["annotations"] = {**(outcome.annotations() if outcome else {}), **(annotations or {})}
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
    # as the launcher records it: the phase, with its reason, exit code and time beside it
    pytest.param([sts(outcome=SUCCEEDED)], [], "Succeeded",
                 f"rank 0 (worker-0 at g-0.g) exited 0 (exit 0) at {SUCCEEDED.time}", id="recorded-success"),
    pytest.param([sts(outcome=FAILED)], [pod("g-0", 0)], "Failed",
                 f"rank 1 (worker-1 at g-1.g) exited with 3 (exit 3) at {FAILED.time}", id="recorded-failure"),
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


@pytest.mark.parametrize("phase", ["Succeeded at 2025-01-01T00:00:00Z: rank 0 exited 0", "Failed: g-1 exited 3",
                                   '{"phase": "Failed", "pod": "g-1", "exitCode": 3}', "Done"])
def test_a_phase_the_launchers_would_not_take_for_an_outcome_is_none_here_either(phase):
    """Written by hand on purpose: the launcher reruns training unless it reads an outcome, so status must not
    call a gang done on an annotation the launcher ignores (both read with Outcome.from_annotations)."""
    assert Outcome.from_annotations({PHASE: phase}) is None
    state = gang_state("g", "ns", [sts(annotations={PHASE: phase})], [pod("g-0", 0), pod("g-1", 1)])
    assert (state.outcome, state.detail) == ("Running", "")


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
    done = gang_state("g", "ns", [sts(outcome=SUCCEEDED)], [pod("g-0", 0), pod("g-1", 1)])
    assert progress(done) == (f"gang g: Succeeded (2 Running; 0 restarts): rank 0 (worker-0 at g-0.g) exited 0 "
                              f"(exit 0) at {SUCCEEDED.time}")


def test_list_has_one_line_per_gang():
    states = [gang_state("g", "ns", [sts()], [pod("g-0", 0), pod("g-1", 1, restarts=1)])]
    assert format_list(states).splitlines() == ["NAME  FRAMEWORK  SHAPE     PODS  RESTARTS  OUTCOME",
                                                "g     pytorch    worker=2  2/2   1         Running"]
    assert format_list([]) == "no gangs"


def test_a_container_has_a_log_once_it_has_run():
    assert container_started(pod("g-0", 0), "trainer")
    assert not container_started(pod("g-0", 0, "Pending", waiting="ContainerCreating"), "trainer")
    assert not container_started(pod("g-0", 0), "other")
