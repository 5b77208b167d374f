"""AdmissionReview admission.k8s.io/v1 in, AdmissionReview out: one pure function, no I/O.

Two error channels, as the API server expects: a review that is not a well-formed AdmissionReview raises
`BadReview` (the HTTP layer answers 400); a labeled object that cannot work is answered `allowed: false`
with the problems, so the user sees the webhook's message in kubectl's error.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, Protocol

from trainhook.webhook.admission.member import Denied
from trainhook.webhook.admission.jsondiff import diff
from trainhook.webhook.admission.jsontext import json_bytes
from trainhook.webhook.admission.mutate import is_opted_in, key_warnings, mutate
from trainhook.webhook.admission.scale import check_scale
from trainhook.webhook.settings import Settings

API_VERSION = "admission.k8s.io/v1"
OPERATIONS = ("CREATE", "UPDATE", "DELETE", "CONNECT")


class BadReview(ValueError):
    """The request body is not an AdmissionReview this webhook can answer."""


def _field(obj: dict, name: str, kind: type, where: str) -> Any:
    value = obj.get(name)
    if not isinstance(value, kind):
        raise BadReview(f"{where}.{name} must be a {kind.__name__}, got {type(value).__name__}")
    return value


def parse_review(body: Any) -> dict:
    """Validate the envelope; returns `request`."""
    if not isinstance(body, dict):
        raise BadReview("the body must be a JSON object (an AdmissionReview)")
    if body.get("apiVersion") != API_VERSION or body.get("kind") != "AdmissionReview":
        raise BadReview(f"expected apiVersion {API_VERSION} kind AdmissionReview, got "
                        f"{body.get('apiVersion')!r} {body.get('kind')!r}")
    request = _field(body, "request", dict, "review")
    uid = _field(request, "uid", str, "request")
    if not uid:
        raise BadReview("request.uid is empty")
    _field(_field(request, "kind", dict, "request"), "kind", str, "request.kind")
    if request.get("operation") not in OPERATIONS:
        raise BadReview(f"request.operation must be one of {', '.join(OPERATIONS)}, got {request.get('operation')!r}")
    if request["operation"] in ("CREATE", "UPDATE"):
        obj = _field(request, "object", dict, "request")
        if not isinstance(obj.get("metadata", {}), dict) or not isinstance(obj.get("spec", {}), dict):
            raise BadReview("request.object.metadata and .spec must be objects")
    namespace = request.get("namespace", "")
    if not isinstance(namespace, str):
        raise BadReview("request.namespace must be a string")
    return request


@dataclass
class Reviewed:
    """The answer, and what the metrics count about it."""

    answer: dict
    kind: str
    outcome: str  # "mutated", "unchanged" or "denied"
    reasons: list[str] = field(default_factory=list)  # the keys a denial names


def _response(uid: str, **fields: Any) -> dict:
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": {"uid": uid, **fields}}


class Workloads(Protocol):
    """What a scale review reads: the webhook's StatefulSet cache (webhook/statefulset_cache.py)."""

    synced: bool

    def get(self, namespace: str, name: str) -> dict | None: ...


def _size(obj: Any, field_name: str, where: str) -> int:
    """A size field of a Scale or Job; absent is 0 (autoscaling/v1 ScaleSpec omits a zero `replicas`)."""
    spec = obj.get("spec") if isinstance(obj, dict) else None
    value = (spec or {}).get(field_name, 0) if isinstance(spec, dict) else 0
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadReview(f"{where}.spec.{field_name} must be an integer, got {type(value).__name__}")
    return value


def _refused(uid: str, kind: str, message: str, reason: str) -> Reviewed:
    answer = _response(uid, allowed=False, status={"code": 403, "reason": "Forbidden",
                                                   "message": "trainhook: " + message})
    return Reviewed(answer, kind, "denied", [reason])


def review_scale(request: dict, workloads: Workloads | None) -> Reviewed:
    """A `statefulsets/scale` UPDATE (kubectl scale, an HPA, the launcher's scale to zero), checked against the
    cached StatefulSet: the Scale in the review has no labels to say whether it is a gang (docs/operate/webhook.md)."""
    uid, kind = request["uid"], request["kind"]["kind"]
    resource = request.get("resource")
    resource = resource if isinstance(resource, dict) else {}
    if request["operation"] != "UPDATE" or resource.get("resource") != "statefulsets":
        return Reviewed(_response(uid, allowed=True), kind, "unchanged")
    obj = request["object"]
    new = _size(obj, "replicas", "request.object")
    old = _size(request.get("oldObject"), "replicas", "request.oldObject") if request.get("oldObject") else None
    namespace = request.get("namespace") or obj.get("metadata", {}).get("namespace") or "default"
    name = request.get("name") or obj.get("metadata", {}).get("name") or ""
    if workloads is None or not workloads.synced:
        warning = (f"trainhook: the size change of StatefulSet {namespace}/{name} was not checked (the webhook "
                   "has not listed the StatefulSets yet); a trainhook gang that is not elastic cannot change size "
                   "while it runs")
        return Reviewed(_response(uid, allowed=True, warnings=[warning]), kind, "unchanged")
    sts = workloads.get(namespace, name)
    if sts is None:
        return Reviewed(_response(uid, allowed=True), kind, "unchanged")
    if old is not None:  # the size as the API server has it now, not as the cache last saw it
        sts = {**sts, "spec": {**sts.get("spec", {}), "replicas": old}}
    message = check_scale(sts, new)
    if message is not None:
        return _refused(uid, kind, message, "spec.replicas")
    return Reviewed(_response(uid, allowed=True), kind, "unchanged")


def check_job_parallelism(request: dict) -> str | None:
    """An UPDATE of a labeled Job that changes spec.parallelism: the same rule as a StatefulSet's scale."""
    old, obj = request.get("oldObject"), request["object"]
    if not isinstance(old, dict) or not is_opted_in("Job", obj):
        return None
    new = _size(obj, "parallelism", "request.object")
    if new == _size(old, "parallelism", "request.oldObject"):
        return None
    return check_scale({**old, "kind": "Job"}, new)


def review(body: Any, settings: Settings, workloads: Workloads | None = None) -> Reviewed:
    """Answer one AdmissionReview; raises BadReview for a malformed one. `workloads` answers scale reviews."""
    request = parse_review(body)
    uid, kind, operation = request["uid"], request["kind"]["kind"], request["operation"]
    if request.get("subResource") == "scale":
        return review_scale(request, workloads)
    if operation not in ("CREATE", "UPDATE"):
        return Reviewed(_response(uid, allowed=True), kind, "unchanged")
    obj = request["object"]
    namespace = request.get("namespace") or obj.get("metadata", {}).get("namespace") or "default"
    if kind == "Job" and operation == "UPDATE":
        message = check_job_parallelism(request)
        if message is not None:
            return _refused(uid, kind, message, "spec.parallelism")
    try:
        user = (request.get("userInfo") or {}).get("username") or ""
        mutation = mutate(kind, operation, obj, namespace, settings, str(user))
    except Denied as denied:
        refusal: dict[str, Any] = {"allowed": False, "status": {"code": 403, "reason": "Forbidden",
                                                                "message": "trainhook: " + "; ".join(denied.problems)}}
        typos = key_warnings(kind, obj)  # a misspelled key is often why: kubectl prints them with the refusal
        if typos:
            refusal["warnings"] = typos
        return Reviewed(_response(uid, **refusal), kind, "denied", denied.keys)
    except (TypeError, ValueError, AttributeError, KeyError) as e:
        # A field of an unexpected type deep inside the object: the review is malformed, not the webhook.
        raise BadReview(f"request.object has a field of an unexpected type or value: {e!r}") from e
    answer: dict[str, Any] = {"allowed": True}
    patch = diff(obj, mutation.obj)
    if patch:
        answer["patchType"] = "JSONPatch"
        answer["patch"] = base64.b64encode(json_bytes(patch)).decode()
    if mutation.warnings:
        answer["warnings"] = mutation.warnings
    return Reviewed(_response(uid, **answer), kind, "mutated" if patch else "unchanged")
