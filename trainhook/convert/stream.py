"""`trainhook convert`'s input: a YAML stream of Kubeflow jobs, converted one by one (the v1 kinds by core.py,
Trainer v2 TrainJobs by trainjob.py with the runtimes the stream or `--runtime` gives), other objects passed
through as they are."""

from __future__ import annotations

from trainhook.convert.core import KINDS, convert_job, load_documents
from trainhook.convert.policies import ConvertError, Converted
from trainhook.convert.runtimes import CLUSTER_RUNTIME, TRAINER_API, is_runtime, runtime_name
from trainhook.convert.trainjob import TRAINJOB_KIND, convert_trainjob, is_trainer


def is_kubeflow(obj: dict) -> bool:
    """A job of Kubeflow's training operator (kubeflow.org/v1, mpi-operator's v2beta1) or of Trainer v2."""
    return str(obj.get("apiVersion", "")).startswith("kubeflow.org/") or is_trainer(obj)


def names_runtime(job: dict, runtime: dict) -> bool:
    ref = (job.get("spec") or {}).get("runtimeRef") or {}
    return (ref.get("kind") or CLUSTER_RUNTIME) == runtime.get("kind") and \
        ref.get("name") == (runtime.get("metadata") or {}).get("name")


def convert_text(text: str, path: str = "<input>", workload_kind: str = "statefulset",
                 gang_scheduler: str | None = None, namespace: str | None = None,
                 entrypoint: list[str] | None = None, runtimes: list[dict] | None = None) -> Converted:
    """Every Kubeflow job of a YAML stream converted; other objects (ConfigMaps, ...) passed through as they are.
    Training runtimes (in the stream, or `runtimes`, from `--runtime` files) serve the TrainJobs that name them
    and are not output: they are Trainer's objects, meaningless to a cluster without it."""
    result = Converted()
    objects = load_documents(text, path)
    given = [obj for obj in objects if is_runtime(obj)] + list(runtimes or [])
    jobs = [obj for obj in objects if is_kubeflow(obj) and not is_runtime(obj)]
    if not jobs:
        kinds = ", ".join(sorted({k for _, k in KINDS}))
        only = " (only training runtimes: give the TrainJob that names one)" if given else ""
        raise ConvertError(f"{path}: no Kubeflow job to convert{only}: convert reads kubeflow.org {kinds} and "
                           f"{TRAINER_API} {TRAINJOB_KIND}")
    for obj in objects:
        if is_runtime(obj):
            continue
        if is_trainer(obj):
            converted = convert_trainjob(obj, given, workload_kind, gang_scheduler, namespace, entrypoint)
        elif is_kubeflow(obj):
            converted = convert_job(obj, workload_kind, gang_scheduler, namespace, entrypoint)
        else:
            result.objects.append(obj)
            continue
        result.objects += converted.objects
        result.warnings += converted.warnings
    for runtime in (obj for obj in objects if is_runtime(obj)):
        if not any(names_runtime(job, runtime) for job in jobs if is_trainer(job)):
            result.warnings.append(f"{runtime_name(runtime)}: no TrainJob in the input names it; left out (a "
                                   "training runtime is Trainer's object, meaningless without Trainer)")
    return result
