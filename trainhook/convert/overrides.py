"""A TrainJob's pod template overrides, applied to the converted workloads' pod templates.

Trainer has had three spellings of the same idea, all read here: v2.0's `spec.podSpecOverrides` (the pod spec
fields at the top of each entry), v2.1's `spec.podTemplateOverrides` (`metadata` and `spec`), and the newer
`spec.runtimePatches[].trainingRuntimeSpec.template.spec.replicatedJobs[]` that controllers such as Kueue write.
Each names the runtime's replicated jobs it targets (`node`, `launcher`, an initializer); the fields are those
Trainer lets a TrainJob change, merged as Trainer merges them: lists keyed by name are upserted (volumes, env,
volume mounts, image pull secrets, scheduling gates), tolerations appended, the rest replaced.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from trainhook.convert.policies import ConvertError, Fields

# Pod spec fields an override sets outright, and those it upserts by name.
REPLACED = ("serviceAccountName", "nodeSelector", "affinity", "securityContext")
BY_NAME = ("volumes", "imagePullSecrets", "schedulingGates")
CONTAINER_FIELDS = ("env", "volumeMounts")


@dataclass
class Override:
    path: str  # where it was written, for messages: spec.podTemplateOverrides[0]
    targets: list[str]  # the runtime's replicated job names
    metadata: dict
    spec: dict


def overrides_of(spec: dict, fields: Fields) -> list[Override]:
    """Every override of the TrainJob's spec (taken out of it), in the order Trainer applies them."""
    found = []
    for name in ("podSpecOverrides", "podTemplateOverrides"):
        for number, entry in enumerate(spec.pop(name, None) or []):
            entry = copy.deepcopy(entry or {})
            path = f"spec.{name}[{number}]"
            targets = [t.get("name", "") for t in entry.pop("targetJobs", None) or []]
            if not targets:
                raise ConvertError(f"{fields.where}: {path}.targetJobs is empty: name the runtime's jobs it changes "
                                   "(node, launcher)")
            if name == "podSpecOverrides":
                found.append(Override(path, targets, {}, entry))
            else:
                found.append(Override(path, targets, entry.pop("metadata", None) or {}, entry.pop("spec", None) or {}))
                fields.leftovers(path, entry)
    for number, patch in enumerate(spec.pop("runtimePatches", None) or []):
        patch = dict(patch or {})
        path = f"spec.runtimePatches[{number}]"
        patch.pop("manager", None)
        patch.pop("time", None)
        template = dict(((patch.pop("trainingRuntimeSpec", None) or {}).get("template")) or {})
        if template.get("metadata"):
            fields.drop(f"{path}.trainingRuntimeSpec.template.metadata", template["metadata"],
                        "the JobSet's metadata: there is no JobSet here")
        for job_number, job in enumerate(((template.get("spec") or {}).get("replicatedJobs")) or []):
            pod = (((job.get("template") or {}).get("spec") or {}).get("template")) or {}
            job_meta = (job.get("template") or {}).get("metadata")
            job_path = f"{path}.trainingRuntimeSpec.template.spec.replicatedJobs[{job_number}]"
            if job_meta:
                fields.drop(f"{job_path}.template.metadata", job_meta, "a Job's metadata: the workloads take the "
                                                                       "TrainJob's labels and annotations")
            found.append(Override(job_path, [job.get("name", "")], pod.get("metadata") or {}, pod.get("spec") or {}))
        fields.leftovers(path, patch)
    return found


def upsert(items: list[dict], new: list[dict]) -> list[dict]:
    """`items` with each of `new` replacing the item of the same name, or appended."""
    result = [dict(item) for item in items]
    for item in new:
        at = next((i for i, old in enumerate(result) if old.get("name") == item.get("name")), None)
        if at is None:
            result.append(copy.deepcopy(item))
        else:
            result[at] = copy.deepcopy(item)
    return result


def apply_override(template: dict, override: Override, fields: Fields) -> None:
    """One override written into one pod template (the workload's, metadata and spec)."""
    meta = template.setdefault("metadata", {})
    for part in ("labels", "annotations"):
        if override.metadata.get(part):
            meta[part] = {**(meta.get(part) or {}), **override.metadata[part]}
    leftover = {k: v for k, v in override.metadata.items() if k not in ("labels", "annotations")}
    fields.leftovers(f"{override.path}.metadata", leftover)
    spec = template.setdefault("spec", {})
    given = dict(override.spec)
    for name in REPLACED:
        if name in given:
            spec[name] = copy.deepcopy(given.pop(name))
    for name in BY_NAME:
        if name in given:
            spec[name] = upsert(spec.get(name) or [], given.pop(name) or [])
    if "tolerations" in given:
        spec["tolerations"] = (spec.get("tolerations") or []) + copy.deepcopy(given.pop("tolerations") or [])
    for list_name in ("initContainers", "containers"):
        for number, change in enumerate(given.pop(list_name, None) or []):
            change = dict(change)
            name = change.pop("name", "")
            target = next((c for c in spec.get(list_name) or [] if c.get("name") == name), None)
            if target is None:
                have = ", ".join(c.get("name", "?") for c in spec.get(list_name) or []) or "none"
                raise ConvertError(f"{fields.where}: {override.path}.spec.{list_name}[{number}].name={name}: the "
                                   f"runtime's pod has no such {list_name[:-1]} ({list_name}: {have}); Trainer "
                                   "refuses it too")
            for field_name in CONTAINER_FIELDS:
                if field_name in change:
                    target[field_name] = upsert(target.get(field_name) or [], change.pop(field_name) or [])
            if "securityContext" in change:
                target["securityContext"] = change.pop("securityContext")
            fields.leftovers(f"{override.path}.spec.{list_name}[{number}]", change)
    fields.leftovers(f"{override.path}.spec", given)
