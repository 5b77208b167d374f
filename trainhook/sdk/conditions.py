"""Kubeflow training SDK v1's condition calls (`get_job_conditions`, `is_job_running`, `wait_for_job_conditions`,
...) and pod selection (`get_job_pod_names`, `is_master`, `replica_type`, `replica_index`) for
`trainhook.TrainingClient`.

A Kubeflow job carries conditions (Created, Running, Restarting, Succeeded, Failed) that its controller writes; a
trainhook gang has no controller, so the same conditions are derived here, purely, from the gang's state
(trainhook.cluster.status.GangState: the outcome the launchers record, else the Jobs' and pods' phases). The
calls keep Kubeflow's signatures, so code that polls them runs unchanged; `job=` takes the GangState that
`get_job` returns, where Kubeflow's takes its job object.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from trainhook.cluster.status import GangState, pod_rank, training_container_name
from trainhook.gang import keys
from trainhook.sdk.kubeflow import framework_of

CREATED, RUNNING, RESTARTING, SUCCEEDED, FAILED = "Created", "Running", "Restarting", "Succeeded", "Failed"
JOB_CONDITIONS = {CREATED, RUNNING, RESTARTING, SUCCEEDED, FAILED}
# Kubeflow's master replica types: a pod of one of these roles is the job's master (is_master=True).
MASTER_ROLES = ("master", "chief", "launcher")
REPLICA_TYPES = sorted({role for roles in keys.ROLES.values() for role in roles})


class JobFailed(RuntimeError):
    """wait_for_job: the gang failed; `.state` is its last state."""

    def __init__(self, state: GangState):
        super().__init__(f"gang {state.name} failed: {state.detail or 'see get_job_logs'}")
        self.state = state


@dataclass
class JobCondition:
    """Kubeflow's V1JobCondition, field for field (`status` is the string "True" or "False")."""

    type: str
    status: str
    reason: str = ""
    message: str = ""
    last_transition_time: datetime | None = None
    last_update_time: datetime | None = None


def parse_time(text: str | None) -> datetime | None:
    """An RFC 3339 time from the API server or the notary's record; None when absent or unreadable."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def job_conditions(state: GangState) -> list[JobCondition]:
    """The conditions a Kubeflow controller would have written for this gang: Created once it exists; Running
    while every pod runs; Restarting while pods that restarted are not all running again; on the end Running
    False and Succeeded or Failed True, timed by the notary's record when there is one."""
    if state.outcome == "NotFound":
        return []
    recorded = state.recorded
    started = parse_time(recorded.started) if recorded else None
    conditions = [JobCondition(CREATED, "True", "GangCreated", f"gang {state.name} is created")]
    if state.finished:
        ended = parse_time(recorded.ended) if recorded else None
        conditions.append(JobCondition(RUNNING, "False", "GangRunning", f"gang {state.name} ended", started, ended))
        conditions.append(JobCondition(state.outcome, "True", f"Gang{state.outcome}", state.detail, ended, ended))
    elif state.restarts and state.outcome != "Running":
        conditions.append(JobCondition(RESTARTING, "True", "GangRestarting",
                                       f"gang {state.name}: {state.restarts} restarts, {state.detail}".rstrip(", ")))
    elif state.outcome == "Running":
        conditions.append(JobCondition(RUNNING, "True", "GangRunning", f"gang {state.name} is running", started))
    return conditions


def has_condition(conditions: list[JobCondition], wanted: str) -> bool:
    return any(c.type == wanted and c.status == "True" for c in conditions)


def role_index(pod: dict) -> int | None:
    """The pod's index within its role (TRAINHOOK_INDEX, set by the webhook)."""
    wanted = training_container_name(pod)
    for container in (pod.get("spec") or {}).get("containers") or []:
        if container.get("name") == wanted:
            for item in container.get("env") or []:
                if item.get("name") == keys.TH_INDEX and str(item.get("value", "")).isdigit():
                    return int(item["value"])
    return None


def select_pods(pods: list[dict], is_master: bool = False, replica_type: str | None = None,
                replica_index: int | None = None) -> list[dict]:
    """Kubeflow's pod selection on a gang's pods (in rank order): `is_master` the master, chief or launcher pod
    (rank 0 when the gang has none of those roles: `num_workers=N` makes N equal pods, rank 0 standing for
    Kubeflow's master), `replica_type` the pods of that role ("master" again rank 0 without a master role),
    `replica_index` the one with that index in its role."""
    def role(pod: dict) -> str:
        return ((pod.get("metadata") or {}).get("labels") or {}).get(keys.ROLE, "")

    if replica_type is not None and replica_type.lower() not in REPLICA_TYPES:
        raise ValueError(f"replica_type={replica_type!r}: one of {', '.join(REPLICA_TYPES)}")
    chosen = list(pods)
    if is_master:
        masters = [p for p in chosen if role(p) in MASTER_ROLES]
        chosen = masters or [p for p in chosen if pod_rank(p) == 0]
    if replica_type is not None:
        wanted = replica_type.lower()
        typed = [p for p in chosen if role(p) == wanted]
        if not typed and wanted == "master" and not any(role(p) == "master" for p in pods):
            typed = [p for p in chosen if pod_rank(p) == 0]
        chosen = typed
    if replica_index is not None:
        chosen = [p for p in chosen if role_index(p) == replica_index]
    return chosen


class ConditionCalls:
    """Kubeflow v1's condition and pod-name calls; mixed into TrainingClient (core.py), whose get_job and _in
    they use."""

    get_job: Callable[..., GangState]
    _in: Callable[..., Any]

    def _state(self, name: str | None, namespace: str | None, job_kind: str | None, job: Any) -> GangState:
        framework_of(job_kind, None)  # an unknown kind is refused, as Kubeflow refuses it
        if job is not None:
            if not isinstance(job, GangState):
                raise ValueError(f"job= is the GangState get_job returns here, not {type(job).__name__}")
            return job
        if name is None:
            raise ValueError("give the job's name (or job=, a GangState from get_job)")
        return self.get_job(name, namespace)

    def get_job_conditions(self, name: str | None = None, namespace: str | None = None, job_kind: str | None = None,
                           job: GangState | None = None, timeout: int | None = None) -> list[JobCondition]:
        """The gang's conditions, Kubeflow's types (`timeout`, an API request timeout there, is not used)."""
        return job_conditions(self._state(name, namespace, job_kind, job))

    def is_job_created(self, name: str | None = None, namespace: str | None = None, job_kind: str | None = None,
                       job: GangState | None = None, timeout: int | None = None) -> bool:
        return has_condition(self.get_job_conditions(name, namespace, job_kind, job), CREATED)

    def is_job_running(self, name: str | None = None, namespace: str | None = None, job_kind: str | None = None,
                       job: GangState | None = None, timeout: int | None = None) -> bool:
        return has_condition(self.get_job_conditions(name, namespace, job_kind, job), RUNNING)

    def is_job_restarting(self, name: str | None = None, namespace: str | None = None, job_kind: str | None = None,
                          job: GangState | None = None, timeout: int | None = None) -> bool:
        return has_condition(self.get_job_conditions(name, namespace, job_kind, job), RESTARTING)

    def is_job_succeeded(self, name: str | None = None, namespace: str | None = None, job_kind: str | None = None,
                         job: GangState | None = None, timeout: int | None = None) -> bool:
        return has_condition(self.get_job_conditions(name, namespace, job_kind, job), SUCCEEDED)

    def is_job_failed(self, name: str | None = None, namespace: str | None = None, job_kind: str | None = None,
                      job: GangState | None = None, timeout: int | None = None) -> bool:
        return has_condition(self.get_job_conditions(name, namespace, job_kind, job), FAILED)

    def wait_for_job_conditions(self, name: str, namespace: str | None = None, job_kind: str | None = None,
                                expected_conditions: set[str] | None = None, wait_timeout: float = 600,
                                polling_interval: float = 15, callback: Callable[[GangState], Any] | None = None,
                                timeout: int | None = None) -> GangState:
        """Wait until the gang has one of `expected_conditions` (default {"Succeeded"}) and return its state;
        `callback(state)` after each look. A failure not expected raises trainhook.JobFailed (a RuntimeError, as
        Kubeflow raises); TimeoutError after `wait_timeout` seconds."""

        wanted = set(expected_conditions or {SUCCEEDED})
        if not wanted <= JOB_CONDITIONS:
            raise ValueError(f"Expected conditions: {wanted} must be subset of {JOB_CONDITIONS}")
        deadline = time.monotonic() + wait_timeout
        while True:
            state = self._state(name, namespace, job_kind, None)
            conditions = job_conditions(state)
            if callback is not None:
                callback(state)
            if FAILED not in wanted and has_condition(conditions, FAILED):
                raise JobFailed(state)
            if any(has_condition(conditions, c) for c in wanted):
                return state
            if time.monotonic() >= deadline:
                raise TimeoutError(f"Timeout waiting for gang {name} to reach expected conditions: {wanted} (it is "
                                   f"{state.outcome})")
            time.sleep(max(0.0, min(polling_interval, deadline - time.monotonic())))

    def get_job_pod_names(self, name: str, namespace: str | None = None, is_master: bool = False,
                          replica_type: str | None = None, replica_index: int | None = None,
                          timeout: int | None = None) -> list[str]:
        """The gang's pod names in rank order, selected as Kubeflow selects them (select_pods)."""
        from trainhook.cluster.logs import in_rank_order

        pods = in_rank_order(self._in(namespace).gang(name).pods)
        return [p["metadata"]["name"] for p in select_pods(pods, is_master, replica_type, replica_index)]
