"""Kubeflow training SDK's parameter names (v1.7 to v1.9) in trainhook's terms, as pure functions.

Code written for Kubeflow's `TrainingClient` calls `create_job(job_kind="PyTorchJob", train_func=...,
resources_per_worker={"gpu": "2"}, env_vars=...)` or passes a `KubeflowOrgV1PyTorchJob` as `job`. Each name
that means something for a trainhook gang is translated here, the same way Kubeflow's SDK builds its pod
template (so the pods get what they would under Kubeflow); each that does not is refused with a message naming
trainhook's counterpart, rather than a bare TypeError or a silently different gang. docs/use/sdk.md has the table.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainhook.gang import keys
from trainhook.convert.core import KINDS

# Kubeflow's job kinds, as `trainhook convert` knows them: the kind decides the framework.
JOB_KINDS: dict[str, str] = {kind: info.framework for (_, kind), info in KINDS.items()}
# Kubeflow's SDK accepts "gpu" for the NVIDIA device plugin's resource (and lower-cases every name).
RESOURCE_ALIASES = {"gpu": keys.GPU_RESOURCE}
REQUIREMENT_SECTIONS = ("limits", "requests", "claims")


def plain(value: Any) -> Any:
    """A Kubernetes or Kubeflow client model (`V1EnvVar`, `V1ResourceRequirements`, `KubeflowOrgV1PyTorchJob`) as
    the JSON the API server would get, camelCase keys and no unset fields; dicts and lists recursively. Models
    are recognized by the OpenAPI generator's `openapi_types`/`attribute_map`, so neither client is imported."""
    if hasattr(value, "openapi_types") and hasattr(value, "attribute_map"):
        return {value.attribute_map[attr]: plain(getattr(value, attr)) for attr in value.openapi_types
                if getattr(value, attr) is not None}
    if isinstance(value, Mapping):
        return {key: plain(item) for key, item in value.items() if item is not None}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


def framework_of(job_kind: str | None, framework: str | None, default: str = keys.PYTORCH) -> str:
    """trainhook's framework from Kubeflow's `job_kind` ("PyTorchJob") or trainhook's own `framework`."""
    if job_kind is None:
        return framework or default
    if job_kind not in JOB_KINDS:
        known = ", ".join(sorted(JOB_KINDS))
        raise ValueError(f"job_kind={job_kind!r}: trainhook runs {known} (or give trainhook's framework=, one "
                         f"of {', '.join(keys.ROLES)})")
    mapped = JOB_KINDS[job_kind]
    if framework and framework != mapped:
        raise ValueError(f"job_kind={job_kind!r} is framework={mapped!r}, but framework={framework!r} was given "
                         f"too: keep one")
    return mapped


def one_of(kubeflow_name: str, kubeflow_value: Any, name: str, value: Any) -> Any:
    """The value of a parameter that has a Kubeflow name and a trainhook name; both given is refused."""
    if kubeflow_value is not None and value is not None:
        raise ValueError(f"{kubeflow_name}= (Kubeflow's name) and {name}= (trainhook's) mean the same: give one")
    return value if value is not None else kubeflow_value


def gpu_count_checked(value: Any) -> Any:
    """A GPU amount must be a whole number: the device plugin hands out whole devices, and the webhook sizes
    torchrun's processes by it."""
    if isinstance(value, bool) or not (isinstance(value, int) or (isinstance(value, str) and value.isdigit())):
        raise ValueError(f"resources_per_worker: gpu={value!r}: give a whole number of GPUs, e.g. 2 or \"2\"")
    return value


def _amounts(amounts: Mapping, where: str) -> dict:
    found = {}
    for name, value in amounts.items():
        resource = RESOURCE_ALIASES.get(str(name).lower(), str(name).lower())
        if resource in found:
            raise ValueError(f"resources_per_worker{where}: {resource} given twice (gpu means {keys.GPU_RESOURCE})")
        found[resource] = gpu_count_checked(value) if resource == keys.GPU_RESOURCE else value
    return found


def pod_resources(resources_per_worker: Any) -> dict:
    """The training container's `resources`, Kubeflow's rule: a flat dict (`{"cpu": "2", "memory": "8Gi",
    "gpu": "2"}`) is both requests and limits, `gpu` meaning nvidia.com/gpu; a `V1ResourceRequirements` (or a
    dict with `limits`/`requests`) is taken as it is, `gpu` still meaning nvidia.com/gpu."""
    if not resources_per_worker:
        return {}
    value = plain(resources_per_worker)
    if not isinstance(value, dict):
        raise ValueError("resources_per_worker must be a dict such as {'cpu': '2', 'memory': '4Gi', 'gpu': 1} or "
                         "a kubernetes.client.V1ResourceRequirements")
    if set(value) <= set(REQUIREMENT_SECTIONS) and all(isinstance(v, (dict, list)) for v in value.values()):
        return {section: (_amounts(amounts, f".{section}") if section != "claims" else amounts)
                for section, amounts in value.items()}
    amounts = _amounts(value, "")
    return {"requests": dict(amounts), "limits": dict(amounts)}


def env_entries(env: Any, env_vars: Any) -> list[dict]:
    """The training container's own `env`: trainhook's `env={NAME: value}` or Kubeflow's `env_vars` (a dict, or
    a list of `V1EnvVar` or dicts, so `valueFrom` works too)."""
    given = one_of("env_vars", env_vars, "env", env)
    if not given:
        return []
    if isinstance(given, Mapping):
        return [{"name": str(name), "value": str(value)} for name, value in given.items()]
    entries = plain(list(given)) if isinstance(given, (list, tuple)) else None
    if entries is None or not all(isinstance(e, dict) and e.get("name") for e in entries):
        raise ValueError("env_vars must be a dict {NAME: value} or a list of V1EnvVar (or {'name': ..., "
                         "'value': ...} dicts)")
    return entries


def replica_roles(framework: str, num_workers: int | None, num_chief_replicas: int | None,
                  num_ps_replicas: int | None) -> list[tuple[str, int]]:
    """(role, count) of the gang. Chief and PS replicas are TFJob's, as in Kubeflow (at most one chief); an MPI
    gang gets its launcher. `num_workers=None` means one worker unless chief or PS replicas are given."""
    if (num_chief_replicas or num_ps_replicas) and framework != keys.TENSORFLOW:
        raise ValueError(f"num_chief_replicas and num_ps_replicas are TFJob's roles; a {framework} gang has "
                         f"{', '.join(keys.ROLES[framework])} (give job_kind='TFJob' for chief and ps)")
    chief, ps = num_chief_replicas or 0, num_ps_replicas or 0
    workers = num_workers if num_workers is not None else (0 if chief or ps else 1)
    if min(workers, chief, ps) < 0:
        raise ValueError("replica counts cannot be negative")
    if chief > 1:
        raise ValueError(f"num_chief_replicas={chief}: a TFJob has at most one chief")
    if workers + chief + ps < 1:
        raise ValueError("the gang needs at least one pod (num_workers >= 1)")
    roles = [(role, count) for role, count in (("chief", chief), ("ps", ps), ("worker", workers)) if count]
    return [("launcher", 1)] + roles if framework == keys.MPI else roles


def nproc_per_node(num_procs_per_worker: int | str | None, framework: str) -> str:
    """Kubeflow's `num_procs_per_worker` (a PyTorchJob's nprocPerNode) as the nproc-per-node annotation: torchrun's
    processes per pod, which also multiplies WORLD_SIZE when it is a number (Kubeflow's rule); an MPI gang takes
    it as slots per worker. Unset, the webhook runs one process per GPU of the pod (1 without GPUs)."""
    if num_procs_per_worker is None:
        return ""
    if framework not in (keys.PYTORCH, keys.MPI):
        raise ValueError(f"num_procs_per_worker is PyTorchJob's (torchrun's --nproc-per-node); a {framework} gang "
                         f"runs one process per pod")
    return str(num_procs_per_worker)


def kubeflow_job(job: Any) -> dict | None:
    """A Kubeflow job given as `job=` (a `KubeflowOrgV1PyTorchJob`, ... or its dict), else None (trainhook's
    `job=` is a list of manifests)."""
    value = plain(job)
    if isinstance(value, dict) and str(value.get("apiVersion", "")).startswith("kubeflow.org/"):
        return value
    return None


def job_only(given: Mapping[str, Any]) -> None:
    """Kubeflow's rule for `job=`: the job says everything, so only `namespace` may come with it."""
    extra = sorted(name for name, value in given.items() if value not in (None, False, {}, []))
    if extra:
        raise ValueError(f"with job=, only namespace= may be given (the job says the rest); drop "
                         f"{', '.join(extra)}")
