"""The notary: a second HTTPS listener of the webhook that gives gang members their signing key and records, stops
and emits on the gang's behalf (docs/operate/security.md is the spec; its API table is the contract with launcher/).

A request carries the pod's projected token (audience `trainhook`). The notary asks its `Authority` who the token
names (a TokenReview in a cluster), reads that pod and its gang's anchor (rank 0's pod and workload), and lets the
pure decision (membership.py) say whether the pod belongs; what a record does is records.py. This module is only
the order of the I/O; the HTTP mapping (401 unauthenticated, 403 refused, 400 malformed, 503 not decidable yet,
with Retry-After) is routes.py. Refusals are logged once per (pod, reason), at a bounded rate.

At gang start N members ask at once. So a token is verified against the API server's published keys where it
serves them (webhook/notary/jwks.py; a TokenReview at a bounded rate elsewhere), a review's answer is remembered
until shortly before the token expires, a refusal of a token for REFUSAL_TTL seconds, a credential call's pod is
read from its namespace's watch of gang pods (webhook/notary/pod_watch.py), and the gang's anchor is read once
for all of them (single-flight) and kept a few seconds for credential calls: webhook/notary/cache.py, and
`verify` for why a kept copy cannot give a key to anyone fresh reads would refuse.

Nobody unauthenticated can hold the listener (issue 31 item 3): routes.py checks the token, from the request's
headers, before it reads the body. The flags and the authority's choice are in settings.py.

Authorities: `cluster` (webhook/notary/cluster.py: the API server, with the chart's documented RBAC) and
`local:RUN_DIR` (webhook/notary/local.py: the files a `trainhook local` run writes, its runner playing the API server
and the kubelet).
"""

from __future__ import annotations

import collections
import datetime as dt
import logging
import uuid
from dataclasses import dataclass, field
from collections.abc import Callable

from trainhook.webhook.notary.cache import Read, RefusalCache, RefusalLog, ReviewCache, SharedReads
from trainhook.webhook.notary.membership import (WORKLOAD_KINDS, AnchorVerdict, Gang, Identity, Place, Refusal,
                                                 WorkloadRef, admit, gang_key, gang_workloads, identity_from_review,
                                                 is_gang_workload, judge_anchor, pick_anchor, place_of,
                                                 token_claims)
from trainhook.webhook.notary.records import (event, outcome_message, rank_pods, record_patch, recorded_outcome,
                                              same_record)
from trainhook.webhook.notary.authority import Authority, Conflict, Unreachable
from trainhook.webhook.notary.metrics import NotaryMetrics

log = logging.getLogger("trainhook.webhook.notary")

MAX_CONFLICTS = 5  # a StatefulSet's status changes under the record's resourceVersion precondition: re-read


class NoAnchor(Exception):
    """A shared anchor read found no rank 0 to pick among `candidates` (each requester is told why itself)."""

    def __init__(self, candidates: list[dict]):
        super().__init__("no anchor")
        self.candidates = candidates


@dataclass(frozen=True)
class Anchor:
    """A gang's anchor as read: rank 0's pod, its controller reference, that workload (None: gone, or none)."""

    pod: dict
    ref: WorkloadRef | None
    workload: dict | None
    verdicts: dict = field(default_factory=dict, compare=False, repr=False)  # judge_anchor's passes, by its inputs

    def verdict(self, namespace: str, job: str, key: bytes) -> AnchorVerdict:
        """`judge_anchor` of this copy, judged once for all the requesters who share it (a gang's start: the same
        rank 0 pod, workload and key for every member). Only a pass is kept: a refusal is judged again for each."""
        found = self.verdicts.get((namespace, job, key))
        if found is None:
            found = self.verdicts[(namespace, job, key)] = judge_anchor(namespace, job, self.pod, self.workload, key)
        return found

    def vouched_by(self, place: Place) -> bool:
        """Whether the requester's own pod, read now, names this anchor's workload as its controller (kind, name
        and uid) and the copy is of that very workload: then it is this requester's gang, whatever else changed."""
        uid = ((self.workload or {}).get("metadata") or {}).get("uid")
        return place.owner is not None and place.owner == self.ref and uid == place.owner.uid


@dataclass
class Verified:
    """A request's verified member: its place, its gang and the anchor workload as read (None: bare-Pod gang)."""

    place: Place
    gang: Gang
    anchor_workload: dict | None


class Notary:
    """The notary's state: the authority, the gang key, the refusals, and bare-Pod gangs' outcomes (they have no
    workload to record on: kept here, bounded, and said in an Event on rank 0's pod)."""

    def __init__(self, authority: Authority, key: bytes | Callable[[], bytes],
                 now=lambda: dt.datetime.now(dt.timezone.utc), reviews: ReviewCache | None = None,
                 anchors: SharedReads | None = None, metrics: NotaryMetrics | None = None):
        """`key` is the gang key, or a function returning the current one (the webhook's Settings hold it, and
        may adopt a new one while serving). `reviews` and `anchors`: what it remembers (webhook/notary/cache.py).
        `metrics`: the gang metrics it counts (webhook/notary/metrics.py), in the webhook's registry when given."""
        self.reviews = ReviewCache() if reviews is None else reviews  # (an empty cache is falsy: no `or`)
        self.anchors = SharedReads() if anchors is None else anchors
        self.key_now = key if callable(key) else (lambda: key)
        if not self.key_now():
            raise ValueError("the notary needs the gang key (TRAINHOOK_WEBHOOK_GANG_KEY or --gang-key-file)")
        self.authority, self.now = authority, now
        self.refusals = RefusalLog()
        self.refused = RefusalCache()
        self.bare_outcomes: collections.OrderedDict[str, dict] = collections.OrderedDict()
        self.metrics = NotaryMetrics() if metrics is None else metrics

    async def verify(self, token: str, shared: bool = False) -> Verified:
        """Who sent the request, and their gang (Refusal otherwise). The requester's pod is always read afresh.
        With `shared` (a credential call) the gang's anchor may be a copy read up to ANCHOR_TTL seconds ago, but
        only when the requester's own controller, read now, is that copy's workload, uid included: then the copy
        names the gang the requester's own pod names (the key cannot be an earlier job's), and it cannot refuse
        or 503 the requester either. Every other requester is judged on an anchor read after its request began."""
        began = self.anchors.clock()
        remembered = self.refused.get(token)
        if remembered is not None:
            raise remembered
        try:
            identity, pod, fresh = await self._who(token, shared)
            try:
                place = place_of(identity, pod, self.key_now())
            except Refusal:  # a refusal is decided on a fresh read, never on the watch's copy
                if fresh:
                    raise
                place = place_of(identity, await self.authority.get_pod(identity.namespace, identity.pod),
                                 self.key_now())
        except Refusal as e:  # who the token is, and that its pod is (still) in a gang: kept REFUSAL_TTL seconds
            self.refused.put(token, e)
            raise
        try:
            anchor = await self._anchor(place, None if shared else began)
            if anchor.started < began and not anchor.value.vouched_by(place):
                anchor = await self._anchor(place, began)
            return await self._decide(place, anchor.value, began)
        except Refusal as e:  # a new one: a shared read's refusal is one object for all who shared it
            refusal = Refusal(e.status, e.reason)
            refusal.who = f"{identity.namespace}/{identity.pod}"
            raise refusal from None

    async def _who(self, token: str, shared: bool = False) -> tuple[Identity, dict | None, bool]:
        """The token's identity (verified, or its remembered answer), that pod as read now, and whether it was read
        with a GET (else it is the watch's copy). The pod is read only once the token is verified: a token nobody
        issued makes no read. With `shared` (a credential call) the pod comes from the namespace's watch where the
        authority keeps one (pod_watch.py says why that is as fresh)."""
        authority, known = self.authority, self.reviews.get(token)
        if known is None:
            known = await authority.review_token(token)
            claims = token_claims(token)
            if claims is not None:  # not a JWT (a local run's tokens): nothing to keep
                self.reviews.put(token, known or {}, claims.expires)
        identity = identity_from_review(known)
        member_pod = getattr(authority, "member_pod", None)
        if shared and member_pod is not None:
            return identity, *await member_pod(identity.namespace, identity.pod, identity.pod_uid)
        return identity, await authority.get_pod(identity.namespace, identity.pod), True

    async def _anchor(self, place: Place, fresh_after: float | None) -> Read:
        """The gang's anchor, shared by concurrent requests of the gang (one read for all of them). The pick
        depends on the key alone; a failed one is made again with each requester's own place, so its refusal
        names that requester, not the one whose request started the read."""
        key = ("anchor", place.namespace, place.job, place.anchor_hostname)
        try:
            return await self.anchors.get(key, lambda: self._read_anchor(place), fresh_after)
        except NoAnchor as e:
            pick_anchor(place, e.candidates)  # raises this requester's refusal
            raise Refusal(503, f"rank 0's pod of gang {place.namespace}/{place.job} is not known yet") from None

    async def _read_anchor(self, place: Place) -> Anchor:
        authority = self.authority
        named = await authority.get_pod(place.namespace, place.anchor_hostname)
        try:
            pod = pick_anchor(place, [named] if named else [])
        except Refusal:  # rank 0's pod is not named after its hostname (a Job's, a bare pod's): look by label
            candidates = await authority.list_gang_pods(place.namespace, place.job)
            try:
                pod = pick_anchor(place, candidates)
            except Refusal:
                raise NoAnchor(candidates) from None
        owner_meta = pod.get("metadata") or {}
        ref = next((WorkloadRef(r.get("kind", ""), r.get("name", ""), r.get("uid", ""))
                    for r in owner_meta.get("ownerReferences") or [] if r.get("controller")), None)
        workload = None
        if ref is not None and ref.kind in WORKLOAD_KINDS:
            workload = await authority.get_workload(place.namespace, ref.kind, ref.name)
        return Anchor(pod, ref, workload)

    async def _decide(self, place: Place, anchor: Anchor, began: float) -> Verified:
        own = None
        owner = place.owner
        if owner is not None and owner != anchor.ref and owner.kind in WORKLOAD_KINDS:  # another role's workload
            own = (await self.anchors.get(("workload", place.namespace, owner.kind, owner.name),
                                          lambda: self.authority.get_workload(place.namespace, owner.kind,
                                                                              owner.name), began)).value
        verdict = anchor.verdict(place.namespace, place.job, self.key_now())
        return Verified(place, admit(place, verdict, own), anchor.workload)

    # --- what the calls do, once verified --------------------------------------------------------------------
    def credential(self, verified: Verified) -> dict:
        gang = verified.gang
        key = gang_key(self.key_now(), gang)
        return {"namespace": gang.namespace, "job": gang.job, "gang": gang.gang_id, "key": key}

    def current_outcome(self, verified: Verified) -> dict | None:
        if verified.gang.bare:
            return self.bare_outcomes.get(verified.gang.gang_id)
        return recorded_outcome(verified.anchor_workload)

    async def record(self, verified: Verified, outcome: dict) -> dict:
        """Record `outcome` once (first write wins), stop the gang's StatefulSets, emit the Events; returns the
        outcome that is recorded. A retry of the same record finishes what an error interrupted."""
        return await self.record_on(verified.gang, verified.anchor_workload, outcome)

    async def record_on(self, gang: Gang, workload: dict | None, outcome: dict) -> dict:
        """`record` for `gang`, whose anchor workload as read is `workload`: a coordinator's record, or the sweep's
        for a gang whose coordinator is gone (webhook/notary/sweep.py)."""
        if gang.bare:
            kept = self.bare_outcomes.setdefault(gang.gang_id, outcome)
            while len(self.bare_outcomes) > 10_000:
                self.bare_outcomes.popitem(last=False)
            if kept is outcome:
                await self._emit(gang, [gang.anchor_workload], *outcome_message(outcome), key=outcome["time"])
            return kept
        pods = await self.authority.list_gang_pods(gang.namespace, gang.job)  # once: names and workloads both
        outcome = self._with_pods(gang, outcome, pods)
        for _ in range(MAX_CONFLICTS):
            recorded = recorded_outcome(workload)
            if recorded is not None:
                if not same_record(recorded, outcome):
                    return recorded
                break
            version = ((workload or {}).get("metadata") or {}).get("resourceVersion")
            try:
                await self.authority.patch_workload(gang.namespace, gang.anchor_workload.kind,
                                                    gang.anchor_workload.name, record_patch(outcome, version))
                break
            except Conflict:
                workload = await self.authority.get_workload(gang.namespace, gang.anchor_workload.kind,
                                                             gang.anchor_workload.name)
        else:
            raise Unreachable(f"the record on {gang.anchor_workload.kind}/{gang.anchor_workload.name} kept "
                              "conflicting with other writes")
        workloads = await self._workloads(gang, pods)
        for ref, obj in workloads[1:]:
            if recorded_outcome(obj) is None:
                await self.authority.patch_workload(gang.namespace, ref.kind, ref.name, record_patch(outcome))
        for ref, obj in workloads:
            if ref.kind == "StatefulSet" and (obj.get("spec") or {}).get("replicas") != 0:
                await self.authority.scale_to_zero(gang.namespace, ref.name)
        await self._emit(gang, [ref for ref, _ in workloads], *outcome_message(outcome), key=outcome["time"])
        log.info("gang outcome recorded", extra={"gang": gang.gang_id, "phase": outcome["phase"],
                                                 "code": outcome["code"], "rank": outcome["rank"]})
        return outcome

    @staticmethod
    def _with_pods(gang: Gang, outcome: dict, pods: list[dict]) -> dict:
        """The outcome with the pod names of the ranks it names (the deciding one, and those whose last lines it
        keeps), read from the gang's own `pods`: a launcher cannot know its Job pod's generated name."""
        names = rank_pods(pods, {ref.uid for ref in gang_workloads(gang, pods)})
        found = {rank: names[rank] for rank in {outcome["rank"], *outcome.get("logs", {})} if rank in names}
        return {**outcome, "pod": outcome.get("pod") or found.get(outcome["rank"], ""), "pods": found}

    async def emit(self, verified: Verified, kind: str, reason: str, message: str) -> None:
        gang = verified.gang
        if gang.bare:
            targets = [gang.anchor_workload]
        else:
            pods = await self.authority.list_gang_pods(gang.namespace, gang.job)
            targets = [ref for ref, _ in await self._workloads(gang, pods)]
        await self._emit(gang, targets, kind, reason, message, key=uuid.uuid4().hex)

    async def _workloads(self, gang: Gang, pods: list[dict]) -> list[tuple[WorkloadRef, dict]]:
        """The gang's workloads as read now, found from its `pods` (a list of them just made): the anchor's first,
        then the others that carry the job name. A 10,000-pod gang's list is seconds of the API server's and the
        notary's time, so a record lists once for the ranks' pod names and the workloads both."""
        found: list[tuple[WorkloadRef, dict]] = []
        for ref in gang_workloads(gang, pods):
            obj = await self.authority.get_workload(gang.namespace, ref.kind, ref.name)
            if obj is None or (obj.get("metadata") or {}).get("uid") != ref.uid:
                continue
            if ref == gang.anchor_workload or is_gang_workload(obj, gang.job):
                found.append((ref, obj))
        return found

    async def _emit(self, gang: Gang, targets: list[WorkloadRef], kind: str, reason: str, message: str,
                    key: str) -> None:
        now = self.now()
        for ref in targets:
            await self.authority.create_event(gang.namespace, event(gang, ref, kind, reason, message, now, key))
