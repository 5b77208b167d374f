"""Workload kinds trainhook does not wire, refused by name when a manifest labels them for training.

trainhook wires a gang made of StatefulSets, Indexed Jobs or bare Pods, with a headless Service: kinds whose pods
have a stable name and index (a rank) and an address a peer can resolve before they run. A Deployment, ReplicaSet,
DaemonSet or ReplicationController has neither, so labeling one `trainhook.dev/framework` cannot make it a gang;
taken as any unknown kind, it was left out with a warning and the rest explained, which read as accepted. `explain`
and `submit -f` refuse it instead, naming the kind and the supported ones (the webhook refuses it at admission).
"""

from __future__ import annotations

from trainhook.local.manifest import ManifestError, unsupported_kind_problem
from trainhook.yaml_stream import yaml_documents



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
    return [problem for problem in (unsupported_kind_problem(obj, path) for obj in objects) if problem]


def check_kinds(text: str, path: str) -> None:
    """Raise ManifestError naming every Deployment, ReplicaSet, DaemonSet or ReplicationController of the manifest
    text that is labeled for training (on itself or its pod template)."""
    problems = unsupported_problems(objects_of(yaml_documents(text, path, ManifestError)), path)
    if problems:
        raise ManifestError("\n".join(problems))
