"""A Kubeflow job's lifecycle fields as the gang's (docs/use/gang-lifecycle.md): the replica types' restartPolicy and
runPolicy's backoffLimit, activeDeadlineSeconds, cleanPodPolicy, ttlSecondsAfterFinished, suspend and managedBy.

Kubeflow retries members one by one; a gang is retried whole, by its launchers (`trainhook.dev/on-failure:
restart-gang`, at most `trainhook.dev/max-restarts` times, for the failures `trainhook.dev/failure-rules` retries).
So backoffLimit becomes the gang's restart budget and never a Job's: a Job retrying one pod on its own would start
it outside the gang (render gives every Job `backoffLimit: 0`), and the restartPolicy says which failures are
retried: ExitCode is the default failure rules (signals, lost peers and timeouts retried, exit 1-127 fatal),
OnFailure and Always retry any exit code (`restart-gang: 1-255`). Whatever Kubeflow would do that the gang does not
is said in a warning, with the field, its value and what happens instead; a value that asks for what trainhook
does anyway is taken silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from trainhook.gang import keys
from trainhook.convert.policies import Fields, as_int
from trainhook.render.objects import ACTIVE_DEADLINE_SECONDS, ON_FAILURE

# The runPolicy.managedBy that means "Kubeflow's own controller": trainhook's workloads are Kubernetes' own.
KUBEFLOW_MANAGER = "kubeflow.org/training-operator"
DEFAULT_MAX_RESTARTS = "3"  # the launcher's, when trainhook.dev/max-restarts is not set
MPI_OPERATOR_BACKOFF = 6  # mpi-operator v2 copies runPolicy.backoffLimit to its launcher Job: a Job's default
# Kubeflow's OnFailure and Always as failure rules: every failing exit code restarts the gang (within max-restarts).
# ExitCode needs none: the default rules retry what it retries (128 and above) and fail 1-127, as it does.
ANY_EXIT_CODE_RULES = f"{keys.RESTART_GANG}: 1-255"


@dataclass
class Lifecycle:
    """What the lifecycle fields become besides annotations: fields of every Indexed Job's spec."""

    active_deadline_seconds: int | None = None
    job_spec: dict = field(default_factory=dict)  # ttlSecondsAfterFinished, suspend


def pod_restart_policy(restart: str) -> str:
    """The pod restartPolicy Kubeflow gives a replica type (ExitCode pods are Never: the operator retries them)."""
    return "Never" if restart == "ExitCode" else restart


def types_path(specs_path: str, types: list[str]) -> str:
    """`spec.pytorchReplicaSpecs.Worker` or, for several types, `spec.pytorchReplicaSpecs.{Master,Worker}`."""
    return f"{specs_path}.{types[0]}" if len(types) == 1 else f"{specs_path}.{{{','.join(types)}}}"


class Restart(NamedTuple):
    """A replica type's restartPolicy, and whether Kubeflow's default gave it (the job names none)."""

    policy: str
    defaulted: bool = False


def restart_policies(restarts: dict[str, Restart], backoff: int | None, specs_path: str, launcher_job: bool,
                     fields: Fields, annotations: dict) -> None:
    """The replica types' restartPolicy and runPolicy.backoffLimit as `on-failure`, `failure-rules` and
    `max-restarts`.

    Kubeflow counts backoffLimit against the types that retry (OnFailure and Always on any exit code, ExitCode on
    128 and above) and fails the job at a Never type's first failure; without backoffLimit it retries without bound.
    mpi-operator v2 (`launcher_job`) gives backoffLimit to its launcher Job instead, which reruns a failed launcher
    whatever its restartPolicy, 6 times by default. A gang has one set of failure rules for all its members: when
    any type retries on any exit code, the gang does (`restart-gang: 1-255`), else the default rules are
    ExitCode's."""
    any_code = [t for t, r in restarts.items() if r.policy in ("OnFailure", "Always")
                or (launcher_job and t.lower() == "launcher")]
    exit_code = [t for t, r in restarts.items() if r.policy == "ExitCode" and t not in any_code]
    retrying = any_code + exit_code
    never = [t for t in restarts if t not in retrying]
    if launcher_job and backoff is None:
        backoff = MPI_OPERATOR_BACKOFF
    if not retrying or backoff == 0:
        annotations[ON_FAILURE] = "fail-gang"  # as in Kubeflow, the first failure fails the job
        if backoff:
            fields.drop("spec.runPolicy.backoffLimit", backoff,
                        "no effect: no replica type retries (restartPolicy Never), so Kubeflow fails the job at the "
                        "first failure, and the gang fails the same way (fail-gang); give the replica types "
                        "restartPolicy ExitCode or OnFailure to retry the gang")
        return
    annotations[ON_FAILURE] = "restart-gang"
    if any_code:
        annotations[keys.FAILURE_RULES] = ANY_EXIT_CODE_RULES
    if backoff is None:
        fields.warnings.append(
            f"{fields.where}: {shown(specs_path, retrying, restarts)} without spec.runPolicy.backoffLimit: "
            f"Kubeflow retries without bound; trainhook restarts the gang together, at most "
            f"{annotations.get(keys.MAX_RESTARTS, DEFAULT_MAX_RESTARTS)} times ({keys.MAX_RESTARTS})")
    elif annotations.get(keys.MAX_RESTARTS, str(backoff)) != str(backoff):
        fields.drop("spec.runPolicy.backoffLimit", backoff,
                    f"{keys.MAX_RESTARTS} is one number for torchrun's and the gang's restarts, and "
                    f"spec.elasticPolicy.maxRestarts={annotations[keys.MAX_RESTARTS]} already set it")
    else:
        annotations[keys.MAX_RESTARTS] = str(backoff)
    rerun = [t for t in any_code if restarts[t].policy not in ("OnFailure", "Always")]
    if rerun:  # the launcher Job's doing, not its restartPolicy's: say why a Never or ExitCode launcher retries
        fields.warnings.append(
            f"{fields.where}: {shown(specs_path, rerun, restarts)}: mpi-operator's launcher Job reruns a failed "
            f"launcher on any exit code, and so does the gang, restarting every member together "
            f"({keys.FAILURE_RULES}: '{ANY_EXIT_CODE_RULES}')")
    if any_code and exit_code:
        fields.warnings.append(
            f"{fields.where}: {shown(specs_path, exit_code, restarts)} next to "
            f"{shown(specs_path, any_code, restarts)}: a gang has one set of failure rules, "
            f"'{ANY_EXIT_CODE_RULES}' ({keys.FAILURE_RULES}), so their exits 1-127 restart the gang too, where "
            "Kubeflow fails the job; edit the annotation in the output to choose "
            "(docs/use/gang-lifecycle.md#failure-rules)")
    if never:
        rules = f"'{ANY_EXIT_CODE_RULES}'" if any_code else "the default failure rules (exit codes 128 and above)"
        fields.warnings.append(
            f"{fields.where}: {shown(specs_path, never, restarts)}: Kubeflow fails the job when such a member "
            f"fails; under restart-gang its failures restart the gang like any member's, as {rules} say")


def shown(specs_path: str, types: list[str], restarts: dict[str, Restart]) -> str:
    """`spec.xReplicaSpecs.{A,B}.restartPolicy=OnFailure/ExitCode`, saying when it is Kubeflow's default."""
    policies = "/".join(dict.fromkeys(restarts[t].policy for t in types))
    default = " (Kubeflow's default)" if all(restarts[t].defaulted for t in types) else ""
    return f"{types_path(specs_path, types)}.restartPolicy={policies}{default}"


def clean_pod_policy(path: str, value: object, workload_kind: str, fields: Fields) -> None:
    """cleanPodPolicy against what a finished gang leaves (docs/use/gang-lifecycle.md): a StatefulSet gang is scaled to
    zero, so every pod is deleted (All); an Indexed Job's pods end with the gang and stay (Running, None)."""
    if workload_kind == "statefulset":
        if value != "All":
            fields.drop(path, value, "a StatefulSet gang's pods are all deleted when it is done, finished ones too "
                                     "(it is scaled to zero, as with All); the outcome stays in trainhook.dev/"
                                     "phase-reason, the logs in your log collector; use --kind job to keep the pods")
    elif value not in ("Running", "None"):
        fields.drop(path, value, "an Indexed Job's pods end with the gang and stay until the Job is deleted (trainhook "
                                 "delete, or spec.runPolicy.ttlSecondsAfterFinished)")


def run_policy(policy: dict, restarts: dict[str, Restart], specs_path: str, launcher_job: bool, workload_kind: str,
               scheduler: str | None, fields: Fields, annotations: dict) -> Lifecycle:
    """runPolicy (the mapping, whose fields are taken out; schedulingPolicy is scheduling_of's) and the replica
    types' restartPolicy as the gang's annotations and the Indexed Jobs' own fields."""
    lifecycle = Lifecycle()
    deadline = policy.pop("activeDeadlineSeconds", None)
    if deadline is not None:
        lifecycle.active_deadline_seconds = as_int(deadline, "spec.runPolicy.activeDeadlineSeconds")
        annotations[ACTIVE_DEADLINE_SECONDS] = str(lifecycle.active_deadline_seconds)
    backoff = policy.pop("backoffLimit", None)
    restart_policies(restarts, None if backoff is None else as_int(backoff, "spec.runPolicy.backoffLimit"),
                     specs_path, launcher_job, fields, annotations)
    if "cleanPodPolicy" in policy:
        clean_pod_policy("spec.runPolicy.cleanPodPolicy", policy.pop("cleanPodPolicy"), workload_kind, fields)
    if "ttlSecondsAfterFinished" in policy:
        ttl = as_int(policy.pop("ttlSecondsAfterFinished"), "spec.runPolicy.ttlSecondsAfterFinished")
        if workload_kind == "job":
            lifecycle.job_spec["ttlSecondsAfterFinished"] = ttl  # the TTL controller deletes each Job and its pods
        else:
            fields.drop("spec.runPolicy.ttlSecondsAfterFinished", ttl,
                        "nothing deletes a finished StatefulSet gang: its pods go (it is scaled to zero), the "
                        "StatefulSets and the Service stay until trainhook delete; use --kind job for a TTL")
    suspend = policy.pop("suspend", False)
    if suspend and workload_kind == "job" and scheduler != "kueue":
        lifecycle.job_spec["suspend"] = True  # resume every role's Job together (docs/use/convert.md)
    elif suspend:
        fields.drop("spec.runPolicy.suspend", suspend,
                    "Kueue suspends the jobs it queues; trainhook's pods wait in Kueue's queue instead"
                    if scheduler == "kueue" else "a StatefulSet cannot be suspended: apply the manifests when the "
                    "gang should run, or use --kind job (suspended Indexed Jobs)")
    manager = policy.pop("managedBy", KUBEFLOW_MANAGER)
    if manager != KUBEFLOW_MANAGER:
        fields.drop("spec.runPolicy.managedBy", manager,
                    "trainhook's workloads are run by Kubernetes' own StatefulSet and Job controllers, which no "
                    "other controller takes over; create the gang in the cluster that should run it")
    fields.leftovers("spec.runPolicy", policy)
    return lifecycle
