"""Which controller made a gang pod: checked and stamped at admission, where the webhook sees who creates the pod,
and verified by the notary before it acts on a workload (issue 31: the confused deputy).

A pod's ownerReferences are whatever its creator wrote. A user who may only create pods once wrote one naming an
unrelated StatefulSet, labeled the pod rank 0 of a gang of that name, and the notary recorded an outcome on that
StatefulSet and scaled it to zero. Two things stop it:
- at CREATE, a gang pod that names a StatefulSet or Job as its controller must be created by that controller
  (the review's userInfo: kube-controller-manager's ServiceAccount for it, or its own identity where it runs
  without --use-service-account-credentials); anyone else is refused, naming who and what;
- the pod is stamped (`trainhook.dev/provenance`) with an HMAC, under the release's gang key, of what the notary
  trusts about it: its namespace, its controller (kind, name, uid), its gang's job name and its place (a
  StatefulSet pod's name; a Job pod's completion index: its name is generated after admission). ownerReferences
  and labels can be patched after admission without the webhook (pods are registered at CREATE only); the stamp
  cannot be made without the key, so the notary refuses a pod whose stamp does not match what it says now.
Pure functions; the key comes in Settings, as every other input.
"""

from __future__ import annotations

import hmac
from types import EllipsisType

from trainhook.gang import keys
from trainhook.webhook.admission.member import Problems

STAMP_VERSION = "v1"
# Who creates each kind's pods: kube-controller-manager's per-controller ServiceAccount
# (--use-service-account-credentials, kubeadm's default and the tests' control plane), or its own identity.
CONTROLLER_USERS: dict[str, tuple[str, ...]] = {
    "StatefulSet": ("system:serviceaccount:kube-system:statefulset-controller", "system:kube-controller-manager"),
    "Job": ("system:serviceaccount:kube-system:job-controller", "system:kube-controller-manager"),
}


def controller_ref(pod: dict) -> tuple[str, str, str] | None:
    """(kind, name, uid) of the pod's controlling owner, or None."""
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("controller"):
            return str(ref.get("kind", "")), str(ref.get("name", "")), str(ref.get("uid", ""))
    return None


def check_creator(owner: tuple[str, str, str] | None, user: str, extra_users: tuple[str, ...],
                  problems: Problems) -> None:
    """Refuse a gang pod whose controller `owner` (controller_ref) is a StatefulSet or Job, but which that
    controller did not create. `user` is the review's userInfo.username ("" when the review carries none: nothing
    is refused then, as for a webhook called by tests without a user); `extra_users` are the operator's additions
    (--controller-users)."""
    if owner is None or owner[0] not in CONTROLLER_USERS or not user:
        return
    allowed = CONTROLLER_USERS[owner[0]] + extra_users
    if user not in allowed:
        problems.add(f"ownerReferences[{owner[0]}]", owner[1],
                     f"a gang pod controlled by {owner[0]} {owner[1]} is created by the {owner[0]} controller "
                     f"({allowed[0]}), but {user} created this one",
                     f"create the {owner[0]} instead and let its controller make the pods; if the cluster's "
                     f"controller-manager runs as another user, give it to the webhook (--controller-users)")


def _claim(namespace: str, pod: dict, owner: tuple[str, str, str] | None) -> bytes | None:
    """What the stamp vouches for, or None for a pod no StatefulSet or Job controls (a bare pod: nothing to stamp;
    a bare gang's outcome touches no workload)."""
    if owner is None or owner[0] not in CONTROLLER_USERS:
        return None
    meta = pod.get("metadata") or {}
    job = (meta.get("labels") or {}).get(keys.JOB_NAME, "")
    place = meta.get("name", "") if owner[0] == "StatefulSet" else \
        (meta.get("annotations") or {}).get(keys.JOB_COMPLETION_INDEX, "")
    return "\0".join(("trainhook provenance", STAMP_VERSION, namespace, *owner, job, place)).encode()


def stamp(key: bytes, namespace: str, pod: dict,
          owner: tuple[str, str, str] | None | EllipsisType = ...) -> str | None:
    """The stamp of a controller-made gang pod under `key`, or None (no key, or no controller to vouch for).
    `owner` is the pod's controller_ref (None: it has none) when the caller has read it (admission reads it once
    per pod); left out, it is read here."""
    claim = _claim(namespace, pod, controller_ref(pod) if owner is ... else owner)
    if not key or claim is None:
        return None
    # OpenSSL's one-shot HMAC: in the webhook's process a copy of a keyed HMAC object cost ~4x as much (profiled in
    # the notary at a gang's start, where each member's pod and rank 0's are verified)
    return f"{STAMP_VERSION} {hmac.digest(key, claim, 'sha256').hex()}"


def verify(key: bytes, namespace: str, pod: dict,
           owner: tuple[str, str, str] | None | EllipsisType = ...) -> bool:
    """Whether `pod`, as read now, carries the stamp of what it says now: made by the controller it names, in the
    gang and at the place it names. False without a stamp, a key, or a controller. `owner`: as for `stamp`."""
    expected = stamp(key, namespace, pod, owner)
    found = ((pod.get("metadata") or {}).get("annotations") or {}).get(keys.PROVENANCE)
    return expected is not None and isinstance(found, str) and \
        hmac.compare_digest(found.encode("utf-8", "replace"), expected.encode())  # any annotation a user wrote
