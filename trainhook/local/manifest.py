"""Read a multi-document manifest the way `kubectl apply -f` reads it, keeping what a local run can emulate.

Supported: Services, StatefulSets (apps/v1), Jobs (batch/v1), bare Pods, ConfigMaps and Secrets. Every other
kind is listed in `Manifest.ignored` (the CLI prints it as one warning) and left out. Namespaces are filled in
as the apiserver fills them: the object's own, else the one given with `-n`, else `default`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path

from trainhook.gang import keys
from trainhook.yaml_stream import yaml_documents

DEFAULT_NAMESPACE = "default"

# (apiVersion, kind) of every object a local run understands.
SERVICE = ("v1", "Service")
POD = ("v1", "Pod")
CONFIGMAP = ("v1", "ConfigMap")
SECRET = ("v1", "Secret")
STATEFULSET = ("apps/v1", "StatefulSet")
JOB = ("batch/v1", "Job")
WORKLOADS = (STATEFULSET, JOB, POD)
SUPPORTED = (SERVICE, CONFIGMAP, SECRET) + WORKLOADS


class ManifestError(Exception):
    """The manifest cannot be read; the message names the file and, for YAML errors, the line and column."""


@dataclass
class Manifest:
    """The supported objects of a manifest, in file order, each with its namespace filled in."""

    path: str
    services: list[dict] = field(default_factory=list)
    # StatefulSets, Jobs and bare Pods, in file order: the objects admitted before the controllers run.
    workloads: list[dict] = field(default_factory=list)
    configmaps: dict[tuple[str, str], dict] = field(default_factory=dict)  # (namespace, name) -> object
    secrets: dict[tuple[str, str], dict] = field(default_factory=dict)
    ignored: list[str] = field(default_factory=list)  # "Kind/name (apiVersion)" of what was left out


def type_of(obj: dict) -> tuple[str, str]:
    return (str(obj.get("apiVersion", "")), str(obj.get("kind", "")))


def describe(obj: dict) -> str:
    """`kind/name`, as kubectl names an object in its messages."""
    meta = obj.get("metadata") or {}
    return f"{str(obj.get('kind', '?')).lower()}/{meta.get('name') or meta.get('generateName') or '?'}"


def _flatten(docs: list[object], path: str) -> list[dict]:
    """Drop empty documents and expand `kind: List` (as kubectl does); every object must be a mapping."""
    objects: list[dict] = []
    for number, doc in enumerate(docs, start=1):
        if doc is None:
            continue
        if not isinstance(doc, dict):
            raise ManifestError(f"{path}: document {number} is a {type(doc).__name__}, not a Kubernetes object")
        if doc.get("kind") == "List" and isinstance(doc.get("items"), list):
            objects.extend(_flatten(doc["items"], path))
            continue
        if not doc.get("apiVersion") or not doc.get("kind"):
            raise ManifestError(f"{path}: document {number}: apiVersion and kind are required")
        objects.append(doc)
    return objects


def _fill_namespace(obj: dict, namespace: str | None, path: str) -> dict:
    obj = copy.deepcopy(obj)
    meta = obj.setdefault("metadata", {})
    if not isinstance(meta, dict):
        raise ManifestError(f"{path}: {describe(obj)}: metadata must be a mapping")
    if not meta.get("name") and not (type_of(obj) == POD and meta.get("generateName")):
        raise ManifestError(f"{path}: a {obj['kind']} needs metadata.name")
    own = meta.get("namespace")
    if own and namespace and own != namespace:
        # kubectl's own refusal when -n and the object disagree.
        raise ManifestError(f"{path}: the namespace from the provided object {own!r} does not match the "
                            f"namespace {namespace!r}; you must pass '--namespace={own}' to apply this object")
    meta["namespace"] = own or namespace or DEFAULT_NAMESPACE
    return obj


def _metadata(obj: object) -> dict:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    return meta if isinstance(meta, dict) else {}


def key_problems(obj: dict) -> list[str]:
    """Why trainhook would not read a trainhook.dev/ key of a Service or workload as written (keys.unknown_keys),
    and a workload (Service) that carries trainhook's keys without the label the webhook's objectSelector matches:
    the webhook never sees it, and its pods would run unwired, each training alone (a StatefulSet's restarting
    forever). The webhook itself only warns on the first kind and cannot see the second; the CLI refuses both."""
    meta = _metadata(obj)
    labels = meta.get("labels")
    labels = labels if isinstance(labels, dict) else {}
    found = keys.unknown_keys(labels, meta.get("annotations"))
    places = [meta]
    if type_of(obj) in (STATEFULSET, JOB):
        spec = obj.get("spec")
        template = _metadata(spec.get("template") if isinstance(spec, dict) else None)
        found += keys.unknown_keys(template.get("labels"), template.get("annotations"), "spec.template.metadata")
        places.append(template)
    gate = keys.JOB_NAME if type_of(obj) == SERVICE else keys.FRAMEWORK
    by_place = [sorted({key for field in ("labels", "annotations") if isinstance(place.get(field), dict)
                        for key in place[field] if isinstance(key, str) and key.startswith(keys.PREFIX)
                        and key != keys.JOB_NAME}) for place in places]
    carried = [key for found_here in by_place for key in found_here]
    if carried and gate not in labels:
        which = [f"{who} carries {', '.join(found_here)}" for who, found_here in zip(("it", "its pod template"),
                                                                                      by_place) if found_here]
        framework = next((str(p["labels"][key]) for p in places if isinstance(p.get("labels"), dict)
                          for key in p["labels"] if key in carried and (key == keys.FRAMEWORK or
                                                                        keys.nearest_key(key) == keys.FRAMEWORK)),
                         "FRAMEWORK")
        value = framework if gate == keys.FRAMEWORK else str(meta.get("name", "NAME"))
        found.append(f"metadata.labels: no {gate}, though {' and '.join(which)}: trainhook's "
                     f"webhook selects {obj.get('kind')}s by that label and never sees this one, so its pods would run "
                     f"unwired, each on its own; label its own metadata {gate}: {value}")
    return found


def kubeflow_hint(kind: tuple[str, str]) -> str:
    """For a Kubeflow job in a manifest (left out like any unknown kind): the command that makes it trainhook's."""
    return "; a Kubeflow job: run `trainhook convert` on it first" if kind[0].startswith("kubeflow.org/") else ""


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


def unsupported_kind_problem(obj: dict, path: str) -> str | None:
    """The refusal of a Deployment, ReplicaSet, DaemonSet or ReplicationController labeled for training (on itself
    or its pod template), as explain, submit and `trainhook local` give it (the webhook refuses it at admission)."""
    kind = str(obj.get("kind", ""))
    where = labeled_for_training(obj) if kind in keys.UNSUPPORTED_KINDS else ""
    if not where:
        return None
    name = (obj.get("metadata") or {}).get("name") or "?"
    return (f"{path}: {kind.lower()}/{name}: {where} is labeled {keys.FRAMEWORK}, but {kind} is an unsupported kind: "
            "trainhook does not wire it (its pods have no stable index for a rank, nor an address a peer can "
            f"resolve); the supported kinds are {keys.SUPPORTED_KINDS}: {keys.UNSUPPORTED_KIND_FIX}")


def parse_manifest(text: str, path: str = "<manifest>", namespace: str | None = None) -> Manifest:
    """Parse manifest text; raises ManifestError with the place of the first problem (every misspelled or
    misplaced trainhook.dev/ key at once, `key_problems`)."""
    manifest = Manifest(path=path)
    seen: set[tuple[str, str, str]] = set()
    typos: list[str] = []
    for raw in _flatten(yaml_documents(text, path, ManifestError), path):
        kind = type_of(raw)
        if kind not in SUPPORTED:
            refused = unsupported_kind_problem(raw, path)
            if refused:
                typos.append(refused)
                continue
            name = (raw.get("metadata") or {}).get("name", "?")
            manifest.ignored.append(f"{kind[1]}/{name} ({kind[0]}{kubeflow_hint(kind)})")
            continue
        if kind in (SERVICE,) + WORKLOADS:
            typos += [f"{path}: {describe(raw)}: {problem}" for problem in key_problems(raw)]
        obj = _fill_namespace(raw, namespace, path)
        meta = obj["metadata"]
        if meta.get("name"):
            key = (kind[1], meta["namespace"], meta["name"])
            if key in seen:
                raise ManifestError(f"{path}: {describe(obj)} appears twice in namespace {meta['namespace']!r}")
            seen.add(key)
        if kind == SERVICE:
            manifest.services.append(obj)
        elif kind == CONFIGMAP:
            manifest.configmaps[(meta["namespace"], meta["name"])] = obj
        elif kind == SECRET:
            manifest.secrets[(meta["namespace"], meta["name"])] = obj
        else:
            manifest.workloads.append(obj)
    if typos:
        raise ManifestError("\n".join(typos))
    return manifest


def load_manifest(path: str | Path, namespace: str | None = None) -> Manifest:
    """Read and parse a manifest file (`-` reads standard input)."""
    if str(path) == "-":
        import sys
        return parse_manifest(sys.stdin.read(), "<stdin>", namespace)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ManifestError(f"cannot read {path}: {e.strerror or e}") from e
    return parse_manifest(text, str(path), namespace)
