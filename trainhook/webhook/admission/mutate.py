"""The mutation as a pure function: (kind, operation, object) in, (object, warnings) out, or Denied.

The patch sent back to the API server is the diff (`jsondiff`) between the object and what this returns, so
no patch path is ever written by hand, and mutating an already mutated object yields an empty patch. The
object given is never changed: the result shares the subtrees it leaves alone (`pods.writable`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainhook.gang import keys
from trainhook.webhook.admission.member import Denied, Problems
from trainhook.webhook.admission.pods import mutate_pod
from trainhook.webhook.settings import Settings
from trainhook.webhook.admission.workloads import mutate_job, mutate_service, mutate_statefulset

# The gate: which label opts each kind in. Objects without it are returned untouched.
GATES = {"Pod": keys.FRAMEWORK, "StatefulSet": keys.FRAMEWORK, "Job": keys.FRAMEWORK, "Service": keys.JOB_NAME}
MUTATED_OPERATIONS = {"Pod": ("CREATE",), "StatefulSet": ("CREATE", "UPDATE"), "Job": ("CREATE", "UPDATE"),
                      "Service": ("CREATE", "UPDATE")}
# Kinds refused when labeled for training (the chart registers them too): they make pods but never a gang.
REFUSED_OPERATIONS = {kind: ("CREATE", "UPDATE") for kind in keys.UNSUPPORTED_KINDS}


@dataclass
class Mutation:
    """The mutated object and the warnings for the user (kubectl prints them)."""

    obj: dict
    warnings: list[str] = field(default_factory=list)


def is_opted_in(kind: str, obj: dict) -> bool:
    gate = GATES.get(kind)
    return bool(gate) and gate in ((obj.get("metadata") or {}).get("labels") or {})


def _metadata(obj: object) -> dict:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    return meta if isinstance(meta, dict) else {}


def key_warnings(kind: str, obj: dict) -> list[str]:
    """A warning per trainhook.dev/ key that trainhook never reads where it is written (a typo, or a label written
    as an annotation), on the object and, for a workload, on its pod template; each names the nearest known key.

    Warnings, not refusals: a manifest written for a newer trainhook may carry a key this one does not know. The
    CLI's tools (render, convert, explain, local) refuse them instead (keys.unknown_keys)."""
    meta = _metadata(obj)
    found = keys.unknown_keys(meta.get("labels"), meta.get("annotations"))
    if kind in ("StatefulSet", "Job"):
        spec = obj.get("spec")
        template = _metadata(spec.get("template") if isinstance(spec, dict) else None)
        found += keys.unknown_keys(template.get("labels"), template.get("annotations"), "spec.template.metadata")
    return found


def unsupported_kind(kind: str, obj: dict) -> Problems:
    """The refusal of a Deployment, ReplicaSet, DaemonSet or ReplicationController labeled for training, on itself
    or on its pod template: taken as any unknown kind it would be admitted untouched and its pods refused one by one
    for a shape they cannot have, which names neither the kind nor the fix."""
    problems = Problems()
    spec = obj.get("spec")
    template = _metadata(spec.get("template") if isinstance(spec, dict) else None)
    for where, meta in (("metadata.labels", _metadata(obj)), ("spec.template.metadata.labels", template)):
        labels = meta.get("labels")
        if isinstance(labels, dict) and keys.FRAMEWORK in labels:
            problems.add(f"{where}.{keys.FRAMEWORK}", labels[keys.FRAMEWORK],
                         f"{kind} is an unsupported kind: trainhook does not wire it (its pods have no stable index "
                         f"for a rank, nor an address a peer can resolve); the supported kinds are "
                         f"{keys.SUPPORTED_KINDS}", keys.UNSUPPORTED_KIND_FIX)
            break
    return problems


def mutate(kind: str, operation: str, obj: dict, namespace: str, settings: Settings, user: str = "") -> Mutation:
    """Wire `obj` into its gang; raise Denied with every problem when a labeled object cannot work. `user` is who
    asks (the review's userInfo.username): a gang pod's creator is checked against its controller."""
    if operation in REFUSED_OPERATIONS.get(kind, ()):
        problems = unsupported_kind(kind, obj)
        if problems:
            raise Denied(problems)
        return Mutation(obj)
    if operation not in MUTATED_OPERATIONS.get(kind, ()):
        return Mutation(obj)
    if not is_opted_in(kind, obj):  # reaches here only without the chart's objectSelector: a typo is still told
        return Mutation(obj, key_warnings(kind, obj))
    warnings: list[str] = key_warnings(kind, obj)
    if kind == "Pod":
        result, problems = mutate_pod(obj, namespace, settings, warnings, user)
    elif kind == "StatefulSet":
        result, problems = mutate_statefulset(obj, operation, warnings)
    elif kind == "Job":
        result, problems = mutate_job(obj, operation, warnings)
    else:
        result, problems = mutate_service(obj, operation, warnings)
    if problems:
        raise Denied(problems)
    return Mutation(result, warnings)
