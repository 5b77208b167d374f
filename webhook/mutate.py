"""The mutation as a pure function: (kind, operation, object) in, (object, warnings) out, or Denied.

The patch sent back to the API server is the diff (`jsondiff`) between the object and what this returns, so
no patch path is ever written by hand, and mutating an already mutated object yields an empty patch. The
object given is never changed: the result shares the subtrees it leaves alone (`pods.writable`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainhook import keys
from trainhook.webhook.gang import Denied
from trainhook.webhook.pods import mutate_pod
from trainhook.webhook.settings import Settings
from trainhook.webhook.workloads import mutate_job, mutate_service, mutate_statefulset

# The gate: which label opts each kind in. Objects without it are returned untouched.
GATES = {"Pod": keys.FRAMEWORK, "StatefulSet": keys.FRAMEWORK, "Job": keys.FRAMEWORK, "Service": keys.JOB_NAME}
MUTATED_OPERATIONS = {"Pod": ("CREATE",), "StatefulSet": ("CREATE", "UPDATE"), "Job": ("CREATE", "UPDATE"),
                      "Service": ("CREATE", "UPDATE")}


@dataclass
class Mutation:
    """The mutated object and the warnings for the user (kubectl prints them)."""

    obj: dict
    warnings: list[str] = field(default_factory=list)


def is_opted_in(kind: str, obj: dict) -> bool:
    gate = GATES.get(kind)
    return bool(gate) and gate in ((obj.get("metadata") or {}).get("labels") or {})


def mutate(kind: str, operation: str, obj: dict, namespace: str, settings: Settings) -> Mutation:
    """Wire `obj` into its gang; raise Denied with every problem when a labeled object cannot work."""
    if operation not in MUTATED_OPERATIONS.get(kind, ()) or not is_opted_in(kind, obj):
        return Mutation(obj)
    warnings: list[str] = []
    if kind == "Pod":
        result, problems = mutate_pod(obj, namespace, settings, warnings)
    elif kind == "StatefulSet":
        result, problems = mutate_statefulset(obj, operation, warnings)
    elif kind == "Job":
        result, problems = mutate_job(obj, operation, warnings)
    else:
        result, problems = mutate_service(obj, operation, warnings)
    if problems:
        raise Denied(problems)
    return Mutation(result, warnings)
