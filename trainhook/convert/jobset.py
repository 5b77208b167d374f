"""The runtime's JobSet template, read for `trainhook convert` of a TrainJob: its replicated jobs (each a pod
template and the step Trainer's ancestor label names), which one is the trainer's, the initializers left out, and
the JobSet's own fields (network, successPolicy, failurePolicy) as the gang's, each mapped or warned."""

from __future__ import annotations

import copy

from trainhook.convert.policies import ConvertError, Fields, as_int
from trainhook.convert.runtimes import ANCESTOR, DATASET_STEP, MODEL_STEP, TRAINER_STEP
from trainhook.gang import keys
from trainhook.render.objects import ON_FAILURE

NODE, LAUNCHER = "node", "launcher"  # Trainer's replicated job names and its training container's name


def runtime_jobs(runtime: dict, source: str, fields: Fields) -> tuple[dict[str, tuple[dict, str]], dict]:
    """The runtime's replicated jobs by name, each (pod template, the step its ancestor label names), and its
    JobSet spec's other fields; what has no counterpart is warned."""
    template = dict((runtime.get("spec") or {}).get("template") or {})
    meta = template.pop("metadata", None)
    if meta:
        fields.drop(f"{source} spec.template.metadata", meta, "the JobSet's metadata: there is no JobSet here")
    jobset = dict(template.pop("spec", None) or {})
    jobs = {}
    for number, job in enumerate(jobset.pop("replicatedJobs", None) or []):
        job = copy.deepcopy(job)
        name = job.pop("name", "")
        path = f"{source} spec.template.spec.replicatedJobs[{number}] ({name})"
        job_template = dict(job.pop("template", None) or {})
        labels = dict((job_template.pop("metadata", None) or {}).get("labels") or {})
        step = labels.pop(ANCESTOR, "")
        job_spec = dict(job_template.pop("spec", None) or {})
        pod = job_spec.pop("template", None) or {}
        if not (pod.get("spec") or {}).get("containers"):
            raise ConvertError(f"{fields.where}: {path}.template.spec.template.spec.containers is empty")
        jobs[name] = (pod, step)
        if job.get("replicas", 1) != 1:
            fields.drop(f"{path}.replicas", job["replicas"], "Trainer runs one Job per replicated job (it sets 1)")
        job.pop("replicas", None)
        job.pop("dependsOn", None)  # the launcher after the nodes: trainhook-launch mpirun waits for its workers
        job_spec.pop("parallelism", None)  # numNodes decides, as in Trainer
        job_spec.pop("completions", None)
        if "backoffLimit" in job_spec:
            fields.drop(f"{path}.template.spec.backoffLimit", job_spec.pop("backoffLimit"),
                        "a Job retrying one pod alone would start it outside the gang; the gang is retried whole "
                        f"({ON_FAILURE}: restart-gang)")
        fields.leftovers(f"{path}.template.metadata.labels", labels)
        fields.leftovers(f"{path}.template.spec", job_spec)
        fields.leftovers(path, job)
    return jobs, jobset


def jobset_policies(jobset: dict, source: str, fields: Fields, annotations: dict) -> None:
    """The JobSet spec's fields besides its jobs: the network the Service gives, failurePolicy as restart-gang."""
    network = dict(jobset.pop("network", None) or {})
    network.pop("publishNotReadyAddresses", None)  # the gang's Service publishes not-ready addresses anyway
    network.pop("enableDNSHostnames", None)  # every pod has its host name under the Service
    fields.leftovers(f"{source} spec.template.spec.network", network)
    success = jobset.pop("successPolicy", None)
    if success and success != {"operator": "All", "targetReplicatedJobs": [LAUNCHER]}:
        fields.drop(f"{source} spec.template.spec.successPolicy", success,
                    "the gang succeeds as trainhook's gangs do (docs/use/gang-lifecycle.md)")
    failure = dict(jobset.pop("failurePolicy", None) or {})
    restarts = as_int(failure.pop("maxRestarts", 0), f"{source} spec.template.spec.failurePolicy.maxRestarts")
    if restarts > 0:  # JobSet recreates every Job on a failure: the gang restarts together, on any exit code
        annotations.update({ON_FAILURE: keys.RESTART_GANG, keys.MAX_RESTARTS: str(restarts),
                            keys.FAILURE_RULES: f"{keys.RESTART_GANG}: 1-255"})
    else:
        fields.warnings.append(
            f"{fields.where}: {source}: without a failurePolicy a Job of Trainer's retries a failed pod alone "
            f"(a Job's default backoffLimit, 6) until the JobSet fails; the gang fails at its first failure here "
            f"(fail-gang); annotate the TrainJob {ON_FAILURE}: restart-gang to retry the gang together")
    fields.leftovers(f"{source} spec.template.spec.failurePolicy", failure)
    fields.leftovers(f"{source} spec.template.spec", jobset)


def trainer_step(jobs: dict[str, tuple[dict, str]], default: str, source: str, where: str) -> str:
    """The replicated job Trainer writes spec.trainer into: the one labeled `trainjob-ancestor-step: trainer`,
    else the one named `default` (node for torch, launcher for mpi), as in the built-in runtimes."""
    labeled = [name for name, (_, step) in jobs.items() if step == TRAINER_STEP]
    if labeled:
        return labeled[0]
    if default in jobs:
        return default
    raise ConvertError(f"{where}: {source} has no trainer job (a replicated job labeled {ANCESTOR}: {TRAINER_STEP}, "
                       f"or named {default}); its jobs: {', '.join(jobs) or 'none'}")


def skip_initializers(jobs: dict[str, tuple[dict, str]], source: str, fields: Fields) -> None:
    for name in [n for n, (_, step) in jobs.items() if step in (DATASET_STEP, MODEL_STEP) or
                 n in (DATASET_STEP, MODEL_STEP)]:
        del jobs[name]
        fields.warnings.append(
            f"{fields.where}: {source}: the replicated job {name} is an initializer Trainer runs before training; "
            f"trainhook has no such step: run it as a Job of its own first (a volume it fills, e.g. a PVC, stays in "
            f"the gang's pod template), or fetch the data in the training command; left out")
