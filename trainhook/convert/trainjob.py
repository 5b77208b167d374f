"""Kubeflow Trainer v2 `TrainJob`s (trainer.kubeflow.org/v1alpha1) as trainhook manifests, as pure functions.

A TrainJob names a runtime (runtimes.py) and says what differs from it (`spec.trainer`: image, command, args, env,
numNodes, resourcesPerNode, numProcPerNode). Trainer builds a JobSet from the runtime's template, writes
`spec.trainer` into the trainer step's `node` container and adds its ML policy's wiring (torch: torchrun's PET_*
variables; mpi: a hostfile and ssh keys). convert builds the same gang as plain workloads and a headless Service
named after the job, which trainhook's webhook wires:

- a torch runtime (`mlPolicy.torch`): one pytorch workload `<job>-node-0` of numNodes pods on port 29400, so the
  pods keep Trainer's host names `<job>-node-0-<i>` and PET_MASTER_ADDR is Trainer's `<job>-node-0-0.<job>`;
- an mpi runtime (`mlPolicy.mpi`; DeepSpeed's too): with `runLauncherAsNode` (the built-in deepspeed-distributed
  and mpi-distributed), one mpi workload `<job>-node-0` whose pod 0 launches and runs ranks like the others (as
  Trainer, one launcher and max(numNodes - 1, 1) nodes); without it, `<job>-launcher` and `<job>-worker` (numNodes
  workers): trainhook's two MPI layouts (docs/use/frameworks/mpi.md).

Pod templates are kept whole; every other field is mapped or named in a warning, never dropped silently
(docs/use/convert.md, "TrainJob"). What cannot work is refused with the fix.
"""

from __future__ import annotations

import copy
import math
from decimal import Decimal, InvalidOperation

from trainhook.convert.core import check_entrypoint_annotation
from trainhook.convert.jobset import LAUNCHER, NODE, jobset_policies, runtime_jobs, skip_initializers, trainer_step
from trainhook.convert.overrides import Override, apply_override, overrides_of
from trainhook.convert.policies import KUBECTL_LAST_APPLIED, KUEUE_QUEUE_LABEL, MPI_IMPLEMENTATIONS, NO_SSH, \
    SERVER_METADATA, WORKERS_REACHED, ConvertError, Converted, Fields, as_int, infer_scheduler, run_mpi_worker, \
    scheduling_of
from trainhook.convert.runtimes import TRAINER_API, TRAINER_GROUP, find_runtime, runtime_name
from trainhook.gang import keys
from trainhook.render.objects import ACTIVE_DEADLINE_SECONDS, Gang, RenderError, gang_objects
from trainhook.render.options import mpi_launch

TRAINJOB_KIND = "TrainJob"
TRAINJOB_MANAGER = "trainer.kubeflow.org/trainjob-controller"  # spec.managedBy's default: Trainer's own controller
TORCH_PORT = 29400  # Trainer's constants.ContainerTrainerPort: PET_MASTER_PORT
MPI_PROGRAMS = ("mpirun", "mpiexec", "orterun", "deepspeed")
SSHD = "sshd"


def is_trainer(obj: dict) -> bool:
    return str(obj.get("apiVersion", "")).startswith(TRAINER_GROUP + "/")


def named_container(template: dict, names: tuple[str, ...]) -> dict | None:
    containers = (template.get("spec") or {}).get("containers") or []
    return next((c for c in containers if c.get("name") in names), None)


def cpu_count(quantity: object) -> int:
    """A CPU quantity as whole CPUs, rounded up as Kubernetes' Quantity.Value() rounds ("500m" is 1), at least 1."""
    text = str(quantity or "0").strip()
    try:
        value = Decimal(text[:-1]) / 1000 if text.endswith("m") else Decimal(text)
    except InvalidOperation:
        return 1
    return max(1, math.ceil(value))


def torch_nproc(value: str, resources: dict | None) -> str:
    """torchrun's processes per node as Trainer's torch plugin resolves `numProcPerNode` from resourcesPerNode:
    `auto` without a GPU resource and `cpu` become the CPU count (limits, else requests), at least 1; `auto` with
    GPUs stays `auto`, which is trainhook's GPU count; a number stays."""
    if resources is None or value not in ("auto", "cpu"):
        return value
    for part in ("limits", "requests"):
        found = resources.get(part)
        if not found:
            continue
        if value == "cpu" and "cpu" in found:
            return str(cpu_count(found["cpu"]))
        if value == "auto":
            if any("gpu" in name.lower() for name in found):
                return "auto"
            return str(cpu_count(found.get("cpu")))
    return value if value == "auto" else "1"


def apply_trainer(template: dict, trainer: dict, with_command: bool, path: str, fields: Fields) -> dict:
    """`spec.trainer` written into the pod's `node` container, as Trainer's JobSet builder writes it: image,
    command and args replaced when given, env upserted by name, resourcesPerNode as the container's resources."""
    container = named_container(template, (NODE, LAUNCHER))
    if container is None:
        container = template["spec"]["containers"][0]
        fields.warnings.append(f"{fields.where}: {path}: no container named {NODE} (Trainer writes spec.trainer into "
                               f"that one); it is written into the first container, {container.get('name')}")
    if trainer.get("image"):
        container["image"] = trainer["image"]
    if with_command:
        for name in ("command", "args"):
            if trainer.get(name) is not None:
                container[name] = list(trainer[name])
    env = list(container.get("env") or [])
    for item in trainer.get("env") or []:
        env = [e for e in env if e.get("name") != item.get("name")] + [copy.deepcopy(item)]
    if env:
        container["env"] = env
    resources = trainer.get("resourcesPerNode")
    if resources and (resources.get("limits") or resources.get("requests")):
        container["resources"] = {k: dict(v) for k, v in resources.items() if k in ("limits", "requests") and v}
    return container


def require_command(container: dict, template: dict, annotations: dict, entrypoint: list[str] | None, path: str,
                    where: str) -> None:
    """The trainer container needs a command (the webhook cannot read an image's ENTRYPOINT to wrap it), as for the
    v1 kinds: `--entrypoint`, or the `trainhook.dev/entrypoint` annotation, or spec.trainer.command."""
    given = {**annotations, **((template.get("metadata") or {}).get("annotations") or {})}
    if keys.ENTRYPOINT in given:
        check_entrypoint_annotation(given[keys.ENTRYPOINT], where)
        return
    if container.get("command") or given.get(keys.LAUNCHER) == keys.LAUNCHER_NONE:
        return
    if entrypoint is not None:
        container["command"] = list(entrypoint)
        return
    raise ConvertError(
        f"{where}: {path}: container {container.get('name')} has no command, in the TrainJob (spec.trainer.command) "
        f"or its runtime: it would run its image's ENTRYPOINT, which trainhook's webhook cannot read to run it under "
        f"trainhook-launch, so it would refuse the pods; write spec.trainer.command (e.g. [torchrun, /app/train.py]), "
        f"or give the image's entrypoint with --entrypoint '[\"python\", \"/app/train.py\"]'")


def worker_command(template: dict, path: str, fields: Fields) -> None:
    """An MPI worker runs `trainhook-launch mpi-worker` instead of the runtime's sshd (and no sshd probe)."""
    container = named_container(template, (NODE,)) or template["spec"]["containers"][0]
    own = run_mpi_worker(container, path, fields, "nodes", "had no command")
    if any(SSHD in word for word in own):
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            if probe in container:
                fields.drop(f"{path}: container {container.get('name')}.{probe}", container.pop(probe),
                            "it probed sshd, which does not run here")


def launcher_command(container: dict, path: str, fields: Fields) -> None:
    """The launcher's command under `trainhook-launch mpirun --`, which runs it as given when it starts with
    mpirun/mpiexec and under `mpirun -np <slots>` otherwise: an mpirun hidden in a shell script would run nested."""
    command = container.get("command") or []
    words = command + (container.get("args") or [])
    if command and command[0].rsplit("/", 1)[-1] not in MPI_PROGRAMS[:3] and \
            any(program in word for word in words for program in MPI_PROGRAMS):
        fields.warnings.append(
            f"{fields.where}: {path}: the command `{' '.join(words)[:120]}` runs mpirun (or deepspeed) inside it; "
            "trainhook-launch mpirun runs a command that does not start with mpirun/mpiexec under `mpirun -np "
            "<slots>`, so that one would run nested: make mpirun (with its flags) the command itself")
    if command:
        container["command"] = mpi_launch(command)


Role = tuple[str, int, dict, tuple[str, ...]]  # (trainhook role, pods, pod template, the runtime jobs it stands for)


def left_out(jobs: dict, source: str, kind: str, fields: Fields) -> None:
    for other in jobs:
        fields.warnings.append(f"{fields.where}: {source}: the replicated job {other} is not part of a {kind} "
                               f"runtime's gang (its trainer job{' and nodes' if kind == 'mpi' else ''}); left out")


def torch_roles(policy: dict, trainer: dict, jobs: dict, nodes: int, source: str, fields: Fields,
                annotations: dict) -> list[Role]:
    """A torch runtime: its trainer job's pods, numNodes of them, as one pytorch workload on Trainer's port."""
    torch = dict(policy.pop("torch", None) or {})
    step = trainer_step(jobs, NODE, source, fields.where)
    template, _ = jobs.pop(step)
    left_out(jobs, source, "torch", fields)
    container = apply_trainer(template, trainer, True, f"{source} {step}", fields)
    value = str(trainer.get("numProcPerNode", torch.pop("numProcPerNode", "auto")))
    torch.pop("numProcPerNode", None)
    nproc = torch_nproc(value, trainer.get("resourcesPerNode"))
    annotations[keys.NPROC_PER_NODE] = nproc
    annotations[keys.PORT] = str(TORCH_PORT)
    gpus = ((container.get("resources") or {}).get("limits") or {}).get(keys.GPU_RESOURCE)
    if nproc == "auto" and not gpus:
        fields.warnings.append(
            f"{fields.where}: numProcPerNode=auto on pods without {keys.GPU_RESOURCE}: torchrun's auto would start "
            f"one process per CPU; trainhook's auto is the GPU count, so 1 here; set spec.trainer.numProcPerNode (or "
            f"resourcesPerNode with a cpu limit, which Trainer turns into the CPU count, as convert does)")
    if "elasticPolicy" in torch:
        fields.drop(f"{source} spec.mlPolicy.torch.elasticPolicy", torch.pop("elasticPolicy"),
                    f"for an elastic gang annotate the TrainJob {keys.ELASTIC}: MIN:MAX "
                    "(docs/use/frameworks/pytorch-elastic.md)")
    fields.leftovers(f"{source} spec.mlPolicy.torch", torch)
    fields.leftovers(f"{source} spec.mlPolicy", policy)
    return [("worker", nodes, template, (step,))]


def mpi_roles(policy: dict, trainer: dict, jobs: dict, nodes: int, source: str, fields: Fields,
              annotations: dict) -> list[Role]:
    """An mpi runtime: with runLauncherAsNode one workload whose pod 0 launches (the launcher's template, one pod
    more than the nodes, as Trainer runs it); without, a launcher and numNodes workers."""
    mpi = dict(policy.pop("mpi", None) or {})
    step = trainer_step(jobs, LAUNCHER, source, fields.where)
    launcher, _ = jobs.pop(step)
    node = jobs.pop(NODE, (None, ""))[0]
    left_out(jobs, source, "mpi", fields)
    if "numProcPerNode" in trainer:
        annotations[keys.SLOTS_PER_WORKER] = str(as_int(trainer["numProcPerNode"], "spec.trainer.numProcPerNode"))
    elif mpi.get("numProcPerNode", 1) != 1:  # Trainer's 1 means the GPU count, as trainhook's default does
        annotations[keys.SLOTS_PER_WORKER] = str(as_int(mpi["numProcPerNode"], "spec.mlPolicy.mpi.numProcPerNode"))
    mpi.pop("numProcPerNode", None)
    implementation = mpi.pop("mpiImplementation", None) or "OpenMPI"
    if implementation not in MPI_IMPLEMENTATIONS:
        raise ConvertError(f"{fields.where}: {source} spec.mlPolicy.mpi.mpiImplementation={implementation}: use "
                           f"{', '.join(MPI_IMPLEMENTATIONS)}")
    annotations[keys.MPI_IMPLEMENTATION] = implementation
    if "sshAuthMountPath" in mpi:
        fields.drop(f"{source} spec.mlPolicy.mpi.sshAuthMountPath", mpi.pop("sshAuthMountPath"), NO_SSH)
    as_node = bool(mpi.pop("runLauncherAsNode", False))
    fields.leftovers(f"{source} spec.mlPolicy.mpi", mpi)
    fields.leftovers(f"{source} spec.mlPolicy", policy)
    apply_trainer(launcher, trainer, True, f"{source} {step}", fields)
    if as_node or node is None:
        if node is not None:
            own = " ".join((named_container(node, (NODE,)) or node["spec"]["containers"][0]).get("command") or [])
            fields.warnings.append(
                f"{fields.where}: {source} {NODE}: the nodes ran `{own or 'their image'}`; with runLauncherAsNode "
                f"every pod here runs the launcher's pod template and command under trainhook-launch mpirun: pod 0 "
                f"launches, the others serve as workers; {WORKERS_REACHED}")
        return [("worker", 1 + max(nodes - 1, 1) if node is not None else nodes, launcher, (step, NODE))]
    apply_trainer(node, {k: v for k, v in trainer.items() if k not in ("command", "args")}, False,
                  f"{source} {NODE}", fields)
    worker_command(node, f"{source} {NODE}", fields)
    return [("launcher", 1, launcher, (step,)), ("worker", nodes, node, (NODE,))]


def apply_to_roles(override: Override, roles: list[Role], runtime_jobs_named: set[str], fields: Fields) -> None:
    """One override written into the templates of the jobs it targets."""
    steps = {s for *_, names in roles for s in names}
    for target in override.targets:
        if target not in steps and target not in runtime_jobs_named:
            raise ConvertError(f"{fields.where}: {override.path}.targetJobs: {target} is not a job of the runtime "
                               f"(its jobs: {', '.join(sorted(runtime_jobs_named))}); Trainer refuses it too")
        if target not in steps:
            fields.warnings.append(f"{fields.where}: {override.path}: targets {target}, a job convert leaves out; "
                                   "not applied there")
    for _, _, template, names in roles:
        hit = [t for t in override.targets if t in names]
        if not hit:
            continue
        apply_override(template, override, fields)
        if set(names) - set(override.targets):
            fields.warnings.append(f"{fields.where}: {override.path} targets {', '.join(hit)}; the pods of "
                                   f"{' and '.join(names)} share one pod template here, so it applies to all of them")


def lifecycle(spec: dict, workload_kind: str, kueue: bool, fields: Fields, annotations: dict) -> dict:
    """suspend, activeDeadlineSeconds and managedBy; returns the Indexed Jobs' own fields."""
    job_spec: dict = {}
    deadline = spec.pop("activeDeadlineSeconds", None)
    if deadline is not None:
        annotations[ACTIVE_DEADLINE_SECONDS] = str(as_int(deadline, "spec.activeDeadlineSeconds"))
    suspend = spec.pop("suspend", False)
    if suspend and workload_kind == "job" and not kueue:
        job_spec["suspend"] = True  # resume every Job of the gang together (docs/use/convert.md)
    elif suspend:
        fields.drop("spec.suspend", suspend,
                    "Kueue suspends the jobs it queues; trainhook's pods wait in Kueue's queue instead" if kueue else
                    "a StatefulSet cannot be suspended: apply the manifests when the gang should run, or use --kind "
                    "job (suspended Indexed Jobs)")
    manager = spec.pop("managedBy", TRAINJOB_MANAGER)
    if manager != TRAINJOB_MANAGER:
        fields.drop("spec.managedBy", manager, "trainhook's workloads are run by Kubernetes' own StatefulSet and Job "
                                               "controllers, which no other controller takes over; create the gang "
                                               "in the cluster that should run it")
    return job_spec


def convert_trainjob(job: dict, runtimes: list[dict] | tuple = (), workload_kind: str = "statefulset",
                     gang_scheduler: str | None = None, namespace: str | None = None,
                     entrypoint: list[str] | None = None) -> Converted:
    """One TrainJob as trainhook objects (Service, workloads, PodGroup) and the warnings for what is left; its
    runtime is one of `runtimes` (runtime manifests) or Trainer's built-in ones (runtimes.py)."""
    meta = copy.deepcopy(job.get("metadata") or {})
    name = meta.pop("name", "")
    where = f"{job.get('kind')}/{name or '?'}"
    if job.get("kind") != TRAINJOB_KIND or job.get("apiVersion") != TRAINER_API:
        raise ConvertError(f"{where}: {job.get('apiVersion')} {job.get('kind')}: of Kubeflow Trainer's kinds convert "
                           f"converts {TRAINER_API} {TRAINJOB_KIND} (with its ClusterTrainingRuntime or "
                           f"TrainingRuntime)")
    if not name:
        raise ConvertError(f"{TRAINJOB_KIND}: metadata.name is required")
    result = Converted()
    fields = Fields(where, result.warnings)
    labels = dict(meta.pop("labels", None) or {})
    annotations_in = dict(meta.pop("annotations", None) or {})
    annotations_in.pop(KUBECTL_LAST_APPLIED, None)
    job_namespace = meta.pop("namespace", None) or namespace
    for server_field in SERVER_METADATA:
        meta.pop(server_field, None)
    fields.leftovers("metadata", meta)
    spec = copy.deepcopy(job.get("spec") or {})
    runtime = find_runtime(spec.pop("runtimeRef", None) or {}, job_namespace, list(runtimes), where)
    source = runtime_name(runtime)
    labels.update(spec.pop("labels", None) or {})  # v2.0: for the JobSet and its Jobs, here the workloads
    annotations_in.update(spec.pop("annotations", None) or {})
    problems = keys.unknown_keys(labels, annotations_in)
    if problems:
        raise ConvertError(f"{where}: " + "; ".join(problems))
    trainer = dict(spec.pop("trainer", None) or {})
    policy = dict((runtime.get("spec") or {}).get("mlPolicy") or {})
    nodes = as_int(trainer.pop("numNodes", policy.pop("numNodes", 1)), "spec.trainer.numNodes")
    policy.pop("numNodes", None)
    if nodes < 1:
        raise ConvertError(f"{where}: spec.trainer.numNodes={nodes}: give at least 1")
    jobs, jobset = runtime_jobs(runtime, source, fields)
    named = set(jobs)
    skip_initializers(jobs, source, fields)
    for part in ("initializer", "datasetConfig", "modelConfig"):
        if part in spec:
            fields.drop(f"spec.{part}", spec.pop(part), "trainhook runs no initializer step: fetch the dataset and "
                                                        "model in the training command or a Job of your own first")
    annotations: dict[str, str] = {}
    jobset_policies(jobset, source, fields, annotations)
    if "torch" in policy:
        roles = torch_roles(policy, trainer, jobs, nodes, source, fields, annotations)
        framework = keys.PYTORCH
    elif "mpi" in policy:
        roles = mpi_roles(policy, trainer, jobs, nodes, source, fields, annotations)
        framework = keys.MPI
    else:
        raise ConvertError(f"{where}: {source} has mlPolicy {', '.join(policy) or 'none'}: convert converts torch "
                           f"and mpi runtimes (PyTorch, DeepSpeed, MPI); write other gangs with trainhook render")
    fields.leftovers("spec.trainer", {k: v for k, v in trainer.items() if k not in
                                      ("image", "command", "args", "env", "resourcesPerNode", "numProcPerNode")})
    for override in overrides_of(spec, fields):
        apply_to_roles(override, roles, named, fields)
    for role, _, template, step in roles:
        container = named_container(template, (NODE, LAUNCHER)) or template["spec"]["containers"][0]
        if framework == keys.PYTORCH or role == LAUNCHER or len(roles) == 1:
            require_command(container, template, annotations_in, entrypoint, f"{source} {step}", where)
        if framework == keys.MPI and (role == LAUNCHER or len(roles) == 1):
            launcher_command(container, f"{source} {step}", fields)
    if all(named_container(t, (NODE,)) for _, _, t, _ in roles):
        annotations[keys.CONTAINER] = NODE
    kueue = gang_scheduler == "kueue" or (not gang_scheduler and bool(labels.get(KUEUE_QUEUE_LABEL)))
    lifecycle_job_spec = lifecycle(spec, workload_kind, kueue, fields, annotations)
    fields.leftovers("spec", spec)
    templates = [(role, count, template) for role, count, template, _ in roles]
    scheduler = gang_scheduler or infer_scheduler([t for _, _, t in templates], labels)
    group_policy = dict((runtime.get("spec") or {}).get("podGroupPolicy") or {})
    scheduling_policy = {}
    if "coscheduling" in group_policy:
        scheduler = scheduler or "coscheduling"
        timeout = (group_policy.pop("coscheduling") or {}).get("scheduleTimeoutSeconds")
        if timeout is not None:
            scheduling_policy["scheduleTimeoutSeconds"] = timeout
    if "volcano" in group_policy:
        scheduler = scheduler or "volcano"
        fields.leftovers(f"{source} spec.podGroupPolicy.volcano", group_policy.pop("volcano") or {})
    fields.leftovers(f"{source} spec.podGroupPolicy", group_policy)
    names = {(t.get("spec") or {}).get("schedulerName") for _, _, t in templates}
    scheduling, priority = scheduling_of(scheduling_policy, scheduler, labels, fields, names)
    if scheduler == "kueue":
        labels.pop(KUEUE_QUEUE_LABEL, None)  # the pods carry it (the webhook), not the workloads
    deadline = annotations.get(ACTIVE_DEADLINE_SECONDS)
    gang = Gang(name=name, framework=framework, roles=templates, kind=workload_kind, namespace=job_namespace,
                annotations=annotations, scheduling=scheduling, role_suffix=True, priority_class=priority,
                active_deadline_seconds=int(deadline) if deadline else None)
    try:
        result.objects = gang_objects(gang)
    except RenderError as e:
        raise ConvertError(f"{where}: {e}") from e
    for obj in result.objects:
        if obj["kind"] not in ("StatefulSet", "Job"):
            continue
        if len(templates) == 1:  # Trainer's host names: <job>-node-0-<i>
            obj["metadata"]["name"] = f"{name}-{NODE}-0"
        if obj["kind"] == "Job":
            obj["spec"].update(lifecycle_job_spec)
        obj["metadata"]["labels"] = {**labels, **obj["metadata"]["labels"]}
        if annotations_in:
            obj["metadata"]["annotations"] = {**annotations_in, **obj["metadata"].get("annotations", {})}
    return result
