"""Gangs whose coordinator is gone too, found and recorded by the notary itself (issue 31 item 4).

A coordinator keeps its outcome until the notary records it (launcher/ending.py), but it can be gone before: a Job
gang's rank 0 that gave up after RECORD_PATIENCE, or one the Job controller stopped when the Job failed (with
`backoffLimit: 0` the first member that exits non-zero fails the Job, and the controller deletes the pods still
running, rank 0 among them) while trainhook's Deployment was away. Then nobody would ever record the gang: no
phase, no Event, `trainhook status` none the wiser. So the notary looks, every `interval` seconds, at the Jobs
labeled trainhook.dev/framework that have no recorded phase (one list per round, a label selector the API server
applies), and records a gang whose Job the Job controller has finished (condition Complete or Failed) once none of
its pods runs any more (so no coordinator can still record it better: the sweep never races a live one).

What it records comes from the cluster, never from a request: the phase from the Job's condition, the deciding
rank, pod and exit code from the gang's failed pods' terminated containers (the first to fail), the time from the
condition. Replicas compute the same record (the first write wins, the Events are named after it), so two
notaries sweeping at once record it once.

Whose objects: only a gang's. The Job must be a trainhook gang's (`is_gang_workload`) and the anchor (its pods are
rank 0's role), and at least one of its pods must carry the webhook's provenance stamp for that Job (the Job
controller made it, the webhook admitted it: webhook/admission/provenance.py): a pod anyone made by hand, naming
the Job as its controller, proves nothing. A gang whose pods are all gone (deleted, or a TTL controller's) cannot
be proven and is left alone, said once. StatefulSet gangs need no sweep: their coordinator's container is rerun by
the kubelet and parks, retrying until recorded; a bare-Pod gang's outcome is its pods' phases.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import random
from typing import TYPE_CHECKING, Protocol

from trainhook.gang import keys
from trainhook.gang.lookup import LABELS, lookup
from trainhook.webhook.admission import provenance
from trainhook.webhook.admission.member import Member, Problems
from trainhook.webhook.admission.pods import member_of
from trainhook.webhook.notary.authority import Unreachable
from trainhook.webhook.notary.membership import Gang, WorkloadRef, is_gang_workload
from trainhook.webhook.notary.records import FAILED, MAX_REASON, SUCCEEDED, _one_line

if TYPE_CHECKING:
    from trainhook.webhook.notary.service import Notary

log = logging.getLogger("trainhook.webhook.notary")

INTERVAL = 30.0  # seconds between rounds: a gang is recorded within about this long of its last pod's end
MAX_GANGS_PER_ROUND = 50  # bounded work a round, whatever the cluster holds
MAX_REMEMBERED = 10_000  # Jobs already said to be unprovable (said once each)
FINISHED = {"Complete": SUCCEEDED, "Failed": FAILED}


class JobLister(Protocol):
    async def list_unrecorded_jobs(self, namespace: str = "") -> list[dict]: ...

    async def list_gang_pods(self, namespace: str, job: str) -> list[dict]: ...


def finished(job: dict) -> tuple[str, dict] | None:
    """(phase, condition) when the Job controller has finished the Job (Complete or Failed True), else None."""
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("status") == "True" and condition.get("type") in FINISHED:
            return FINISHED[condition["type"]], condition
    return None


def controlled_by(pod: dict, uid: str) -> bool:
    owner = provenance.controller_ref(pod)
    return owner is not None and owner[2] == uid


def running(pod: dict) -> bool:
    """Whether a pod may still run a launcher (its phase is not final: it may still record)."""
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def exit_of(pod: dict) -> tuple[str, int] | None:
    """(finishedAt, exit code) of the pod's first container that terminated non-zero, or None."""
    ends = []
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        terminated = (status.get("state") or {}).get("terminated") or {}
        code = terminated.get("exitCode")
        if isinstance(code, int) and code != 0:
            ends.append((str(terminated.get("finishedAt") or ""), code))
    return min(ends) if ends else None


def proven_member(key: bytes, namespace: str, job: dict, pods: list[dict]) -> Member | None:
    """The place of a pod of `job` that carries the webhook's provenance stamp for it, or None: the proof that
    the Job is an admitted gang's, and its shape."""
    uid = (job.get("metadata") or {}).get("uid", "")
    for pod in pods:
        if controlled_by(pod, uid) and provenance.verify(key, namespace, pod):
            member = member_of(pod, namespace, Problems())
            if member is not None:
                return member
    return None


def orphan_outcome(job: dict, phase: str, condition: dict, pods: list[dict], key: bytes,
                   member: Member | None = None) -> tuple[dict, Member] | None:
    """The outcome the notary records for a finished, unrecorded gang Job whose pods have all ended, and the
    place that proves it is a gang's anchor; None when it is not that (yet): a pod still runs, nothing proves the
    Job is an admitted gang, or it is not the anchor (its gang is recorded through rank 0's Job). `member`: the
    proof when the caller has already read it (`proven_member`)."""
    meta = job.get("metadata") or {}
    namespace = meta.get("namespace", "")
    member = member or proven_member(key, namespace, job, pods)
    if member is None or member.role != member.rank0_role or not is_gang_workload(job, member.job_name):
        return None
    if any(running(p) for p in pods):
        return None
    failures = []
    for pod in pods:
        found = exit_of(pod) if provenance.verify(key, namespace, pod) else None
        place = member_of(pod, namespace, Problems()) if found else None
        if found and place is not None and place.job_name == member.job_name:
            failures.append((found[0], place.rank, found[1], pod["metadata"]["name"]))
    why = _one_line(f"{condition.get('reason', '')}: {condition.get('message', '')}".strip(": "), 200)
    gone = "the gang's coordinator (rank 0's launcher) was gone before it could record the outcome, so the notary " \
           "recorded what the Job controller says"
    if phase == SUCCEEDED:
        code, rank, deciding, reason = 0, 0, "", f"the Job completed; {gone}"
    elif failures:
        _, rank, code, deciding = min(failures)
        reason = f"rank {rank} (pod {deciding}) exited {code}; the Job failed ({why}); {gone}"
    else:
        code, rank, deciding, reason = 1, 0, "", f"the Job failed ({why}); {gone}"
    stamp = str(condition.get("lastTransitionTime") or condition.get("lastProbeTime") or "")
    if not stamp:
        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    outcome = {"phase": phase, "code": code, "reason": _one_line(reason, MAX_REASON), "rank": rank,
               "time": stamp, "attempt": 0, "restarts": 0, "logs": {}}
    if deciding:
        outcome["pod"] = deciding
    return outcome, member


class Sweep:
    """The rounds (`run`), and what was said already: one line for each Job that cannot be proven a gang's."""

    def __init__(self, notary: Notary, authority: JobLister, namespaces: tuple[str, ...] = (),
                 interval: float = INTERVAL) -> None:
        """`namespaces`: where to look (the chart's rbac.gangNamespaces); empty: every namespace."""
        self.notary, self.authority, self.namespaces, self.interval = notary, authority, namespaces, interval
        self.unproven: dict[str, None] = {}

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.round()
            except Unreachable as e:
                log.warning("the sweep for unrecorded gangs could not look this round", extra={"error": str(e)})

    async def round(self) -> list[str]:
        """One look: the gangs recorded (as namespace/job)."""
        jobs = []
        for namespace in self.namespaces or ("",):
            jobs += await self.authority.list_unrecorded_jobs(namespace)
        done = []
        candidates = [(job, *ended) for job in jobs if (ended := finished(job)) is not None
                      and (job.get("metadata") or {}).get("uid") not in self.unproven]
        random.shuffle(candidates)  # beyond the round's bound, every candidate gets its turn (none starves)
        for job, phase, condition in candidates[:MAX_GANGS_PER_ROUND]:
            recorded = await self.sweep_job(job, phase, condition)
            if recorded:
                done.append(recorded)
        return done

    async def sweep_job(self, job: dict, phase: str, condition: dict) -> str | None:
        meta = job.get("metadata") or {}
        namespace, name, uid = meta.get("namespace", ""), meta.get("name", ""), meta.get("uid", "")
        job_name = lookup(job, keys.JOB_NAME, LABELS)
        gang_job = job_name.template or job_name.workload or name
        pods = await self.authority.list_gang_pods(namespace, gang_job)
        key = self.notary.key_now()
        proof = proven_member(key, namespace, job, pods)
        found = orphan_outcome(job, phase, condition, pods, key, proof) if proof is not None else None
        if found is None:
            if proof is None and not any(running(p) for p in pods):
                self.unproven[uid] = None
                while len(self.unproven) > MAX_REMEMBERED:
                    self.unproven.pop(next(iter(self.unproven)))
                log.info("a finished gang Job is left unrecorded: none of its pods proves it a gang's (its pods are "
                         "gone, or were not made by the Job controller and admitted)",
                         extra={"namespace": namespace, "job": name})
            return None
        outcome, member = found
        anchor = next((p["metadata"]["name"] for p in pods if controlled_by(p, uid)
                       and (m := member_of(p, namespace, Problems())) is not None and m.rank == 0), "")
        gang = Gang(namespace, member.job_name, anchor, WorkloadRef("Job", name, uid), coordinator=False,
                    roles=tuple(member.shape.roles))
        recorded = await self.notary.record_on(gang, job, outcome)
        log.info("a gang whose coordinator is gone was recorded by the sweep",
                 extra={"gang": gang.gang_id, "phase": recorded["phase"], "code": recorded["code"]})
        return f"{namespace}/{member.job_name}"
