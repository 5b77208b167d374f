"""The notary's membership decision, pure: who a token names, where that pod stands in its gang, who the anchor
is, and whether the pod belongs (docs/operate/security.md, "Membership").

Every function takes objects already read from the API (as dicts, the API's own field names) and returns a
decision or raises `Refusal` with the HTTP status and the reason the caller answers and logs. The gang itself
(role, index, rank, rank 0's address) comes from the webhook's own model (`pods.member_of`), so the notary and
the mutation can never disagree on who is rank 0. The I/O that feeds these functions is in webhook/notary/service.py.
"""

from __future__ import annotations

import base64
import binascii
import hmac
from dataclasses import dataclass
from functools import lru_cache
from types import EllipsisType

from trainhook.gang import keys
from trainhook.gang.lookup import LABELS, lookup
from trainhook.webhook.admission import provenance
from trainhook.webhook.admission.jsontext import parse_body
from trainhook.webhook.admission.member import Member, Problems
from trainhook.webhook.admission.pods import member_of

# What a TokenReview of a pod-bound ServiceAccount token says about the pod (k8s.io/apiserver serviceaccount).
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
WORKLOAD_KINDS = ("StatefulSet", "Job")


class Refusal(Exception):
    """The request is refused: `status` is the HTTP answer (401, 403, 503), the message says why."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.who = ""  # the requesting pod (namespace/name) once its token named one: what the refusal log says


@dataclass(frozen=True)
class Identity:
    """Who a token names: a pod (name and uid) running as a ServiceAccount of `namespace`."""

    namespace: str
    service_account: str
    pod: str
    pod_uid: str


@dataclass(frozen=True)
class WorkloadRef:
    """A gang's workload (or, for a bare-Pod gang, the pod itself): kind, name and uid."""

    kind: str
    name: str
    uid: str


@dataclass(frozen=True)
class Place:
    """A requesting pod, verified against its token, and its place in its gang by the webhook's model."""

    namespace: str
    job: str
    pod: str
    pod_uid: str
    member: Member
    owner: WorkloadRef | None  # its controller (None: a bare pod)

    @property
    def anchor_hostname(self) -> str:
        """Rank 0's hostname (`<prefix>-0`): its pod's name for StatefulSets, its spec.hostname always."""
        return self.member.rank0_address.split(".", 1)[0]


@dataclass(frozen=True)
class Gang:
    """A verified member's gang: its identity (which a deleted and recreated job changes), its anchor, and
    whether the requester is the coordinator."""

    namespace: str
    job: str
    anchor_pod: str
    anchor_workload: WorkloadRef  # kind "Pod" for a bare-Pod gang
    coordinator: bool
    roles: tuple[str, ...] = ()  # the gang's roles, from rank 0's stamped shape: which workloads are the gang's

    @property
    def gang_id(self) -> str:
        return f"{self.namespace}/{self.job}/{self.anchor_workload.uid}"

    @property
    def bare(self) -> bool:
        return self.anchor_workload.kind == "Pod"


def identity_from_review(status: dict | None) -> Identity:
    """The pod a TokenReview's status names; 401 unless the token is authenticated for a pod of a namespace."""
    status = status or {}
    if not status.get("authenticated"):
        error = status.get("error") or "the token is not valid for audience trainhook"
        raise Refusal(401, f"token not authenticated: {error}")
    user = status.get("user") or {}
    username = user.get("username") or ""
    if not username.startswith(SERVICE_ACCOUNT_PREFIX) or username.count(":") != 3:
        raise Refusal(401, f"the token is not a ServiceAccount's ({username or 'no user'})")
    namespace, service_account = username[len(SERVICE_ACCOUNT_PREFIX):].split(":")
    extra = user.get("extra") or {}
    pod, uid = (extra.get(POD_NAME_EXTRA) or [""])[0], (extra.get(POD_UID_EXTRA) or [""])[0]
    if not pod or not uid:
        raise Refusal(401, f"the token of {namespace}/{service_account} is not bound to a pod: use the projected "
                           f"token the webhook mounts at {keys.IDENTITY_DIR}/token")
    return Identity(namespace, service_account, pod, uid)


@dataclass(frozen=True)
class Claims:
    """What a pod-bound ServiceAccount token (a JWT) says of itself, read WITHOUT checking its signature: a hint
    only. The notary uses it to GET the pod alongside the TokenReview (the GET is used only when the review names
    the same pod) and, once the review has authenticated this very token, for how long to remember that answer."""

    namespace: str
    pod: str
    audiences: tuple[str, ...]
    expires: float | None  # seconds since the epoch (`exp`)


@lru_cache(maxsize=64)
def token_claims(token: str) -> Claims | None:
    """The claims of a pod-bound ServiceAccount token (`kubernetes.io: {namespace, pod: {name}}`, `aud`, `exp`),
    or None when the token is no JWT naming a pod (such a token can never name a pod in a TokenReview either).
    Kept for the last 64 tokens (Claims is immutable; at most 1 MB of tokens): a request reads them before its
    review and again, a moment later, to remember the review."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        payload = parse_body(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (binascii.Error, ValueError, RecursionError):  # json's errors and UnicodeDecodeError are ValueErrors
        return None
    if not isinstance(payload, dict) or not isinstance(payload.get("kubernetes.io"), dict):
        return None
    kube = payload["kubernetes.io"]
    pod = kube.get("pod") if isinstance(kube.get("pod"), dict) else {}
    namespace, name = kube.get("namespace"), pod.get("name")
    if not (isinstance(namespace, str) and namespace and isinstance(name, str) and name):
        return None
    aud = payload.get("aud")
    audiences = (aud,) if isinstance(aud, str) else tuple(a for a in aud if isinstance(a, str)) \
        if isinstance(aud, list) else ()
    exp = payload.get("exp")
    return Claims(namespace, name, audiences,
                  float(exp) if isinstance(exp, (int, float)) and not isinstance(exp, bool) else None)


def _owner_ref(pod: dict) -> WorkloadRef | None:
    """The pod's controller as a WorkloadRef (read by provenance.controller_ref, the one walk of ownerReferences)."""
    owner = provenance.controller_ref(pod)
    return WorkloadRef(*owner) if owner else None


def made_by_its_controller(key: bytes, namespace: str, pod: dict, who: str,
                           owner: WorkloadRef | None | EllipsisType = ...) -> None:
    """403 unless a pod that names a StatefulSet or Job as its controller carries the webhook's provenance stamp of
    what it says now (webhook/admission/provenance.py): made by that controller for that gang and place. An
    ownerReference or a job-name label written by anyone else, at creation or by a later patch, is not trusted.
    `owner` is the pod's `_owner_ref` when the caller has read it."""
    owner = _owner_ref(pod) if owner is ... else owner
    if key and owner is not None and owner.kind in WORKLOAD_KINDS and \
            not provenance.verify(key, namespace, pod, (owner.kind, owner.name, owner.uid)):
        raise Refusal(403, f"{who} names {owner.kind}/{owner.name} as its controller, but was not admitted as that "
                           f"controller's pod as it is now (its {keys.PROVENANCE} stamp does not match: created by "
                           "someone else, changed after admission, or admitted before the gang key it was "
                           "stamped with)")


def place_of(identity: Identity, pod: dict | None, key: bytes = b"") -> Place:
    """Verify the token's pod (it still exists, with the token's uid, made by the controller it names when `key`
    is given) and place it in its gang; 403 otherwise."""
    who = f"pod {identity.namespace}/{identity.pod}"
    if pod is None:
        raise Refusal(403, f"{who} does not exist (any more)")
    meta = pod.get("metadata") or {}
    if meta.get("uid") != identity.pod_uid:
        raise Refusal(403, f"{who} is not the pod the token was issued to (it was deleted and recreated)")
    if (pod.get("spec") or {}).get("serviceAccountName", "default") != identity.service_account:
        raise Refusal(403, f"{who} does not run as ServiceAccount {identity.service_account}")
    job = (meta.get("labels") or {}).get(keys.JOB_NAME)
    if not job:
        raise Refusal(403, f"{who} is in no gang: it has no {keys.JOB_NAME} label")
    problems = Problems()
    member = member_of(pod, identity.namespace, problems)
    if member is None:
        raise Refusal(403, f"{who} was not admitted as a member of gang {job}: {'; '.join(problems)}")
    owner = _owner_ref(pod)
    made_by_its_controller(key, identity.namespace, pod, who, owner)
    return Place(identity.namespace, job, identity.pod, identity.pod_uid, member, owner)


def hostname_of(pod: dict) -> str:
    """The pod's hostname: spec.hostname (StatefulSet, Job and admitted bare pods have it), else its name."""
    return (pod.get("spec") or {}).get("hostname") or (pod.get("metadata") or {}).get("name", "")


def pick_anchor(place: Place, candidates: list[dict]) -> dict:
    """Rank 0's pod among `candidates` (the pod named like rank 0's hostname, or the pods labeled with the gang's
    job name): a pod of the same gang whose own place is rank 0, at the hostname the requester's place names.
    503 while no pod of the gang is rank 0 (not created yet); 403 when rank 0 is elsewhere than the requester's
    own labels say (it is not of this gang's shape: a look-alike), or when several pods claim it."""
    claimants = []
    for pod in candidates:
        meta = pod.get("metadata") or {}
        if (meta.get("labels") or {}).get(keys.JOB_NAME) != place.job:
            continue
        member = member_of(pod, place.namespace, Problems())
        if member is not None and member.rank == 0:
            claimants.append(pod)
    gang = f"gang {place.namespace}/{place.job}"
    if not claimants:
        raise Refusal(503, f"rank 0's pod ({place.anchor_hostname}) of {gang} does not exist yet")
    matching = [p for p in claimants if hostname_of(p) == place.anchor_hostname]
    names = sorted((p.get("metadata") or {}).get("name", "") for p in (matching or claimants))
    if not matching:
        raise Refusal(403, f"pod {place.namespace}/{place.pod} is not of {gang}'s shape: its labels put rank 0 at "
                           f"{place.anchor_hostname}, but the gang's rank 0 is {', '.join(names)}")
    if len(matching) > 1:
        raise Refusal(403, f"{gang}: several pods claim rank 0 ({', '.join(names)})")
    return matching[0]


def anchor_workload_of(anchor: dict) -> WorkloadRef:
    """The anchor pod's controller (StatefulSet or Job), or the pod itself for a bare-Pod gang."""
    owner = _owner_ref(anchor)
    meta = anchor.get("metadata") or {}
    if owner is None:
        return WorkloadRef("Pod", meta.get("name", ""), meta.get("uid", ""))
    if owner.kind not in WORKLOAD_KINDS:
        raise Refusal(403, f"rank 0's pod {meta.get('name')} is controlled by a {owner.kind}, not a StatefulSet or Job")
    return owner


def carries_job(workload: dict, job: str) -> bool:
    """Whether a workload is labeled (on itself or its pod template: either place, read by trainhook/gang/lookup.py)
    as a workload of gang `job`."""
    found = lookup(workload, keys.JOB_NAME, LABELS)
    return job in (found.workload, found.template)


def is_gang_workload(workload: dict, job: str) -> bool:
    """Whether a workload is a trainhook gang's of `job`: labeled trainhook.dev/framework (what the webhook admits
    and stamps) and carrying the job name, on itself or its pod template. An unrelated StatefulSet is neither, so no
    pod, whatever ownerReference it was given, makes the notary write to it (issue 31)."""
    framework = lookup(workload, keys.FRAMEWORK, LABELS)
    return bool(framework.workload or framework.template) and carries_job(workload, job)


def role_workloads(job: str, roles: tuple[str, ...]) -> set[str]:
    """The names a multi-role gang's other workloads must have (the webhook refuses any other: <job-name>-<role>);
    a single-role gang has one workload, its anchor's, so none."""
    return {f"{job}-{role}" for role in roles} if len(roles) > 1 else set()


@dataclass(frozen=True)
class AnchorVerdict:
    """What rank 0's pod and workload, as read, say of their gang, judged once for every member that shares the
    read (`judge_anchor`): its controller (kind "Pod" for a bare-Pod gang), its name and uid, the gang's roles."""

    ref: WorkloadRef
    pod: str
    pod_uid: str
    roles: tuple[str, ...] | None  # None: rank 0's pod has no place of its own (each requester's roles are used)


def judge_anchor(namespace: str, job: str, anchor: dict, anchor_workload: dict | None,
                 key: bytes = b"") -> AnchorVerdict:
    """Whether rank 0's pod `anchor` anchors gang `job`: its workload (as read now, None for a bare-Pod gang or when
    it is gone) is still the one it names, a trainhook gang of `job`, and (with `key`) rank 0's pod carries the
    provenance of the controller it names. The same for every member of the gang, so the notary judges a shared
    anchor once (service.py)."""
    anchor_ref = anchor_workload_of(anchor)
    anchor_meta = anchor.get("metadata") or {}
    gang = f"gang {namespace}/{job}"
    if anchor_ref.kind != "Pod":
        if anchor_workload is None or (anchor_workload.get("metadata") or {}).get("uid") != anchor_ref.uid:
            raise Refusal(503, f"{gang}: rank 0's {anchor_ref.kind}/{anchor_ref.name} is gone or being replaced")
        made_by_its_controller(key, namespace, anchor, f"{gang}: rank 0's pod {anchor_meta.get('name')}", anchor_ref)
        if not is_gang_workload(anchor_workload, job):
            raise Refusal(403, f"{gang}: rank 0's pod {anchor_meta.get('name')} names {anchor_ref.kind}/"
                               f"{anchor_ref.name} as its controller, which is not a trainhook gang of job "
                               f"{job} (not labeled {keys.FRAMEWORK} and {keys.JOB_NAME}={job})")
    anchor_member = member_of(anchor, namespace, Problems())
    roles = tuple(anchor_member.shape.roles) if anchor_member is not None else None
    return AnchorVerdict(anchor_ref, anchor_meta.get("name", ""), anchor_meta.get("uid", ""), roles)


def admit(place: Place, verdict: AnchorVerdict, own_workload: dict | None) -> Gang:
    """Whether the placed pod is a member of the gang `verdict` judged (`judge_anchor`); `own_workload` is the
    requester's own controller as read now (None: a bare pod, or gone). Returns the gang, or raises 403."""
    anchor_ref = verdict.ref
    roles = verdict.roles if verdict.roles is not None else tuple(place.member.shape.roles)
    gang = f"gang {place.namespace}/{place.job}"
    who = f"pod {place.namespace}/{place.pod}"
    if anchor_ref.kind == "Pod":  # a bare-Pod gang: every member is a bare pod of the gang
        if place.owner is not None:
            raise Refusal(403, f"{who} is controlled by {place.owner.kind}/{place.owner.name}, but {gang} is a "
                               "gang of bare Pods")
    elif place.owner is None:
        raise Refusal(403, f"{who} only carries the label {keys.JOB_NAME}={place.job}: it is controlled by no "
                           f"workload of {gang} (rank 0 is controlled by {anchor_ref.kind}/{anchor_ref.name})")
    elif place.owner != anchor_ref:
        own_meta = (own_workload or {}).get("metadata") or {}
        if (place.owner.kind not in WORKLOAD_KINDS or own_workload is None or own_meta.get("uid") != place.owner.uid
                or place.owner.name not in role_workloads(place.job, roles)
                or not is_gang_workload(own_workload, place.job)):
            raise Refusal(403, f"{who} is controlled by {place.owner.kind}/{place.owner.name}, which is not a "
                               f"workload of {gang}")
    return Gang(place.namespace, place.job, verdict.pod, anchor_ref, coordinator=verdict.pod_uid == place.pod_uid,
                roles=roles)


def decide(place: Place, anchor: dict, anchor_workload: dict | None, own_workload: dict | None,
           key: bytes = b"") -> Gang:
    """Whether the placed pod is a member of the gang anchored at `anchor`, whose workload (as read now) is
    `anchor_workload` (None for a bare-Pod gang, or when it is gone); `own_workload` is the requester's own
    controller as read now (None: a bare pod, or gone). With `key`, rank 0's pod must carry the provenance of the
    controller it names. Returns the gang, or raises 403/503."""
    verdict = judge_anchor(place.namespace, place.job, anchor, anchor_workload, key)
    return admit(place, verdict, own_workload)


def gang_key(key: bytes, gang: Gang) -> str:
    """The gang's signing key: HMAC-SHA256 of its identity under the webhook's gang key (hex)."""
    return hmac.digest(key, gang.gang_id.encode(), "sha256").hex()


def gang_workloads(gang: Gang, pods: list[dict]) -> list[WorkloadRef]:
    """The workloads to check for an outcome record: the anchor's first, then, for a multi-role gang, every other
    StatefulSet/Job named <job-name>-<role> for one of its roles that controls one of `pods` (the pods labeled with
    the gang's job name); the caller keeps only those that are the gang's (`is_gang_workload`). A look-alike that
    carries the same job name under another name (another team's StatefulSet) is never among them: it forms a gang
    of its own (issue 31). A bare-Pod gang has none."""
    if gang.bare:
        return []
    found = {gang.anchor_workload.uid: gang.anchor_workload}
    names = role_workloads(gang.job, gang.roles)
    for pod in pods:
        owner = _owner_ref(pod)
        if owner is not None and owner.kind in WORKLOAD_KINDS and owner.uid not in found and owner.name in names:
            found[owner.uid] = owner
    return list(found.values())

