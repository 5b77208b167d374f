"""The Kubeflow fields `trainhook convert` maps besides the pod templates and the lifecycle (run_policy.py):
schedulingPolicy, PyTorch's elastic and nproc options, TFJob's and MPIJob's own fields, MPI commands. Each mapper
takes the fields it knows out of the spec (a copy) and records through `Fields` every one it cannot map, so nothing
is dropped silently; a field set to the value that asks for what trainhook does anyway is taken without a word.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import yaml

from trainhook.gang import keys
from trainhook.render.objects import Scheduling
from trainhook.render.options import MPI_WORKER, mpi_launch

MPI_IMPLEMENTATION, SLOTS_PER_WORKER = keys.MPI_IMPLEMENTATION, keys.SLOTS_PER_WORKER
MPI_IMPLEMENTATIONS = ("OpenMPI", "Intel", "MPICH")
# The label Kueue users put on a Kubeflow job to queue it (Kueue's Kubeflow integration).
KUEUE_QUEUE_LABEL = keys.KUEUE_QUEUE_NAME
# How mpirun reaches the workers here (launcher/mpi/kubexec.py, docs/use/frameworks/mpi.md "Transports"): the launcher's
# rsh agent asks each worker's own `trainhook-launch mpi-worker` over the gang's authenticated port (the default
# `gang` transport), so no sshd, no ssh keys and no exec permission are needed.
WORKERS_REACHED = ("mpirun starts its daemons through trainhook's rsh agent, which has each worker's own mpi-worker "
                   "run them, asked over the gang's authenticated port (the default gang transport): no sshd, no ssh "
                   "keys, no exec permission")
NO_SSH = f"trainhook's MPI gangs mount no ssh keys: {WORKERS_REACHED}"


class ConvertError(ValueError):
    """Input convert cannot turn into a gang; the message names the file, object or field."""


@dataclass
class Converted:
    objects: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


# Written by the API server; a job read back with `kubectl get -o yaml` carries them and they mean nothing here.
SERVER_METADATA = ("uid", "resourceVersion", "generation", "creationTimestamp", "managedFields", "selfLink",
                   "deletionTimestamp", "deletionGracePeriodSeconds")
KUBECTL_LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


@dataclass(frozen=True)
class KubeflowKind:
    framework: str
    replica_specs: str  # the spec field holding the replica types
    container: str  # Kubeflow's fixed training container name ("": the first container, mpi-operator v2)
    port_name: str  # the container port name Kubeflow reads the master port from ("": none)
    # Kubeflow's restartPolicy for a replica type that names none (training-operator's <kind>_types.go), and
    # mpi-operator v2beta1's for its launcher Job ("": the same)
    restart_policy: str = "Never"
    launcher_restart_policy: str = ""
    # The replica type the kind runs exactly once ("": none), and whether Kubeflow itself refuses another count
    # (training-operator's ValidateV1PyTorchJobSpec/ValidateV1XGBoostJobSpec "There must be only 1 master replica",
    # mpi-operator's launcher "must be 1"); trainhook's webhook refuses more than one either way.
    single_type: str = ""
    kubeflow_refuses: bool = False

    def default_restart_policy(self, role: str) -> str:
        return (role == "launcher" and self.launcher_restart_policy) or self.restart_policy


class Fields:
    """The warnings of one job: `drop` names a field that has no counterpart (or a value trainhook cannot use),
    `leftovers` every field of a mapping no mapper took."""

    def __init__(self, where: str, warnings: list[str]):
        self.where = where
        self.warnings = warnings

    def drop(self, path: str, value: object, why: str = "no trainhook counterpart") -> None:
        shown = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("...").strip()
        self.warnings.append(f"{self.where}: {path}={shown}: {why}; left out")

    def leftovers(self, path: str, mapping: dict) -> None:
        for name, value in mapping.items():
            self.drop(f"{path}.{name}", value)


def as_int(value: object, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConvertError(f"{path}: expected an integer, got {value!r}")
    return value


def training_container(template: dict, kind: KubeflowKind, main_container: str) -> dict | None:
    containers = (template.get("spec") or {}).get("containers") or []
    wanted = main_container or kind.container
    if not wanted:
        return containers[0] if containers else None
    return next((c for c in containers if c.get("name") == wanted), None)


def kubeflow_port(container: dict | None, port_name: str) -> int | None:
    for port in (container or {}).get("ports") or []:
        if port_name and port.get("name") == port_name and port.get("containerPort"):
            return int(port["containerPort"])
    return None


def infer_scheduler(templates: list[dict], labels: dict) -> str | None:
    """The gang scheduler a Kubeflow job was written for, when the job says so itself."""
    if labels.get(KUEUE_QUEUE_LABEL):
        return "kueue"
    names = {(t.get("spec") or {}).get("schedulerName") for t in templates}
    if names == {keys.VOLCANO_SCHEDULER}:
        return "volcano"
    if names and all(n and "scheduler-plugins" in n for n in names):
        return "coscheduling"
    return None


def scheduling_of(policy: dict, scheduler: str | None, labels: dict, fields: Fields,
                  scheduler_names: set) -> tuple[Scheduling | None, str]:
    """runPolicy.schedulingPolicy (and Kueue's queue label) as trainhook's gang-scheduling options, and the
    priority class (for the pods, with or without a gang scheduler)."""
    policy = dict(policy or {})
    path = "spec.runPolicy.schedulingPolicy"
    queue = policy.pop("queue", "") or labels.get(KUEUE_QUEUE_LABEL, "")
    minimum = policy.pop("minAvailable", None)
    priority = policy.pop("priorityClass", "")
    timeout = policy.pop("scheduleTimeoutSeconds", None)
    min_resources = policy.pop("minResources", None)
    fields.leftovers(path, policy)
    if scheduler is None:
        for name, value in (("minAvailable", minimum), ("queue", queue), ("scheduleTimeoutSeconds", timeout),
                            ("minResources", min_resources)):
            if value:
                fields.drop(f"{path}.{name}", value, "no gang scheduler named (give --gang-scheduler)")
        return None, priority
    if scheduler != "volcano" and scheduler != "coscheduling" and min_resources:
        fields.drop(f"{path}.minResources", min_resources, f"{scheduler} has no PodGroup to carry it")
        min_resources = None
    if scheduler != "coscheduling" and timeout is not None:
        fields.drop(f"{path}.scheduleTimeoutSeconds", timeout, "only the coscheduling PodGroup has it")
        timeout = None
    if scheduler == "coscheduling" and queue:
        fields.drop(f"{path}.queue", queue, "the coscheduling plugin has no queues")
        queue = ""
    scheduler_name = ""
    if scheduler == "coscheduling":
        scheduler_name = next((n for n in scheduler_names if n and n != "default-scheduler"), "")
    return Scheduling(scheduler=scheduler, queue=queue, priority_class=priority, scheduler_name=scheduler_name,
                      min_available=None if minimum is None else as_int(minimum, f"{path}.minAvailable"),
                      schedule_timeout_seconds=None if timeout is None else
                      as_int(timeout, f"{path}.scheduleTimeoutSeconds"),
                      min_resources=min_resources), priority


def pytorch_options(spec: dict, workers: int, fields: Fields, annotations: dict) -> None:
    nproc = spec.pop("nprocPerNode", None)
    elastic = spec.pop("elasticPolicy", None)
    if elastic is not None:
        elastic = dict(elastic)
        low = as_int(elastic.pop("minReplicas", workers), "spec.elasticPolicy.minReplicas")
        high = as_int(elastic.pop("maxReplicas", workers), "spec.elasticPolicy.maxReplicas")
        annotations[keys.ELASTIC] = f"{low}:{high}"
        if "maxRestarts" in elastic:
            annotations[keys.MAX_RESTARTS] = str(as_int(elastic.pop("maxRestarts"), "spec.elasticPolicy.maxRestarts"))
        backend = elastic.pop("rdzvBackend", "c10d")
        if backend != "c10d":
            fields.drop("spec.elasticPolicy.rdzvBackend", backend, "trainhook's elastic rendezvous is c10d")
        if "rdzvPort" in elastic:
            annotations.setdefault(keys.PORT, str(as_int(elastic.pop("rdzvPort"), "spec.elasticPolicy.rdzvPort")))
        legacy = elastic.pop("nProcPerNode", None)
        if nproc is None and legacy is not None:
            nproc = str(legacy)
        elif legacy is not None:  # Kubeflow refuses the two together
            fields.drop("spec.elasticPolicy.nProcPerNode", legacy,
                        f"deprecated, and Kubeflow refuses it with spec.nprocPerNode; spec.nprocPerNode={nproc} "
                        "is used")
        if not elastic.get("standalone", True):
            elastic.pop("standalone")  # false: the rendezvous is not local to one pod, as here
        for name, why in (("rdzvHost", "the rendezvous is rank 0's address"),
                          ("rdzvId", "the rendezvous id is the job name"),
                          ("rdzvConf", "no trainhook counterpart: trainhook's c10d rendezvous takes torchrun's "
                                       "defaults; pass --rdzv-conf to torchrun in the command"),
                          ("standalone", "the rendezvous is rank 0's, for a gang of any size (a one-pod gang too)"),
                          ("metrics", "no autoscaler: trainhook has no controller; the gang runs with its "
                                      "replicas, within trainhook.dev/elastic")):
            if name in elastic:
                fields.drop(f"spec.elasticPolicy.{name}", elastic.pop(name), why)
        fields.leftovers("spec.elasticPolicy", elastic)
    if nproc is not None:
        annotations[keys.NPROC_PER_NODE] = str(nproc)


def mpi_options(spec: dict, api_version: str, fields: Fields, annotations: dict) -> str:
    """MPIJob's own fields; returns the v1 mainContainer (the training container's name) or ""."""
    if "slotsPerWorker" in spec:
        annotations[SLOTS_PER_WORKER] = str(as_int(spec.pop("slotsPerWorker"), "spec.slotsPerWorker"))
    implementation = spec.pop("mpiImplementation", None)
    if implementation:
        if implementation not in MPI_IMPLEMENTATIONS:
            raise ConvertError(f"{fields.where}: spec.mpiImplementation={implementation}: use "
                               f"{', '.join(MPI_IMPLEMENTATIONS)}")
        annotations[MPI_IMPLEMENTATION] = implementation
    creation = spec.pop("launcherCreationPolicy", "AtStartup")
    if creation == "WaitForWorkersReady":
        annotations[keys.GANG_WAIT] = "tcp"  # the launcher starts once every worker is up and reachable
    elif creation != "AtStartup":
        fields.drop("spec.launcherCreationPolicy", creation, "not an mpi-operator policy (AtStartup, "
                                                             "WaitForWorkersReady); the launcher starts at once")
    if spec.get("runLauncherAsWorker") is False:
        spec.pop("runLauncherAsWorker")  # mpi-operator's default: the launcher runs no ranks, as here
    for name, why in (("sshAuthMountPath", NO_SSH),
                      ("runLauncherAsWorker", "the launcher pod is not in the hostfile and runs no ranks; for a gang "
                                              "whose every pod runs ranks, write one workload without roles, whose "
                                              "pod 0 launches (docs/use/frameworks/mpi.md, two layouts)")):
        if name in spec:
            fields.drop(f"spec.{name}", spec.pop(name), why)
    return spec.pop("mainContainer", "") if api_version == "kubeflow.org/v1" else ""


def set_mpi_commands(templates: list[tuple[str, int, dict]], kind: KubeflowKind, main_container: str,
                     fields: Fields) -> None:
    """The launcher runs its mpirun through `trainhook-launch mpirun --` (which writes the hostfile and the rsh
    agent, examples/mpi/); the workers run `trainhook-launch mpi-worker` instead of mpi-operator's sshd."""
    for role, _, template in templates:
        container = training_container(template, kind, main_container) or template["spec"]["containers"][0]
        path = f"spec.{kind.replica_specs}.{role.capitalize()}"
        if role == "launcher":  # without a command, convert.require_commands found its entrypoint annotated
            if container.get("command"):
                container["command"] = mpi_launch(container["command"])
            continue
        run_mpi_worker(container, path, fields, "workers", "had no command (mpi-operator ran sshd)")


def run_mpi_worker(container: dict, path: str, fields: Fields, who: str, nothing: str) -> list[str]:
    """Make an MPI worker's container run `trainhook-launch mpi-worker` (mpirun's daemons start through it, not
    sshd), saying what the `who` ran before (`nothing` when no command); returns that command and its args."""
    own = (container.get("command") or []) + (container.get("args") or [])
    if own[:2] != MPI_WORKER:
        what = f"ran `{' '.join(own)}`" if own else nothing
        fields.warnings.append(f"{fields.where}: {path}: the {who} {what}; they run `trainhook-launch mpi-worker` "
                               f"instead ({WORKERS_REACHED})")
        container["command"] = list(MPI_WORKER)
        container.pop("args", None)
    return own
