"""Workload kinds trainhook does not wire, refused by name when a manifest labels them for training.

trainhook wires a gang made of StatefulSets, Indexed Jobs or bare Pods, with a headless Service: kinds whose pods
have a stable name and index (a rank) and an address a peer can resolve before they run. A Deployment, ReplicaSet,
DaemonSet or ReplicationController has neither, so labeling one `trainhook.dev/framework` cannot make it a gang;
taken as any unknown kind, it was left out with a warning and the rest explained, which read as accepted. `explain`
and `submit -f` refuse it instead, naming the kind and the supported ones (the webhook refuses it at admission).
"""

from __future__ import annotations

from trainhook.gang import keys
from trainhook.local.manifest import ManifestError
from trainhook.yaml_stream import yaml_documents

# Kinds that make pods but not a gang: no stable index for a rank, no stable address (the API group does not
# matter: an extensions/v1beta1 Deployment is the same).
UNSUPPORTED_KINDS = ("Deployment", "ReplicaSet", "DaemonSet", "ReplicationController")
SUPPORTED = "StatefulSet, Job (Indexed), Pod, Service"


def _labels(meta: object) -> dict:
    labels = meta.get("labels") if isinstance(meta, dict) else None
    return labels if isinstance(labels, dict) else {}


def labeled_for_training(obj: dict) -> str:
    """Where `obj` carries trainhook.dev/framework: "" (nowhere), "it" or "its pod template"."""
    if keys.FRAMEWORK in _labels(obj.get("metadata")):
        return "it"
    spec = obj.get("spec")
    template = spec.get("template") if isinstance(spec, dict) else None
    if isinstance(template, dict) and keys.FRAMEWORK in _labels(template.get("metadata")):
        return "its pod template"
    return ""


def objects_of(docs: list[object]) -> list[dict]:
    """The mappings of a stream, a `kind: List` expanded (what parse_manifest reads; its own errors are its)."""
    found: list[dict] = []
    for doc in docs:
        if isinstance(doc, dict) and doc.get("kind") == "List" and isinstance(doc.get("items"), list):
            found += objects_of(doc["items"])
        elif isinstance(doc, dict):
            found.append(doc)
    return found


def unsupported_problems(objects: list[dict], path: str) -> list[str]:
    problems = []
    for obj in objects:
        kind = str(obj.get("kind", ""))
        where = labeled_for_training(obj) if kind in UNSUPPORTED_KINDS else ""
        if where:
            name = (obj.get("metadata") or {}).get("name") or "?"
            problems.append(f"{path}: {kind.lower()}/{name}: {where} is labeled {keys.FRAMEWORK}, but {kind} is an "
                            "unsupported kind: trainhook does not wire it (its pods have no stable index for a rank, "
                            f"nor an address a peer can resolve); the supported kinds are {SUPPORTED}: make it a "
                            "StatefulSet (with a headless Service as its serviceName) or an Indexed Job, e.g. with "
                            "trainhook render")
    return problems


def check_kinds(text: str, path: str) -> None:
    """Raise ManifestError naming every Deployment, ReplicaSet, DaemonSet or ReplicationController of the manifest
    text that is labeled for training (on itself or its pod template)."""
    problems = unsupported_problems(objects_of(yaml_documents(text, path, ManifestError)), path)
    if problems:
        raise ManifestError("\n".join(problems))
