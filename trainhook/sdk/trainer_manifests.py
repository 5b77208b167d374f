"""Trainer v2's `train(runtime, trainer=CustomTrainer(...))` as trainhook manifests, and a gang read back as a
`TrainJob`: pure functions, no cluster.

The manifests are the v1 surface's (core.job_manifests: a labeled StatefulSet and its headless Service, the
function shipped in the command), so a function trains the same way from either SDK. What Trainer v2 does
differently is kept: `func(**func_args)` (keyword arguments, not one dict), `resources_per_node` names as Trainer
reads them (`gpu` and `storage` aliases, extended resources' case kept), every `pip_index_urls` entry, and the
runtime's image and node count. What has no counterpart is refused naming the trainhook call to use instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainhook.cluster.status import GangState, pod_rank, training_container_name
from trainhook.gang import keys
from trainhook.render.options import RenderOptions, render
from trainhook.sdk.command import function_command
from trainhook.sdk.conditions import parse_time
from trainhook.sdk.core import job_manifests
from trainhook.sdk.trainer_types import BUILTIN_RUNTIMES, DEFAULT_RUNTIME, NODE, STATUS_OF_OUTCOME, UNKNOWN, \
    Runtime, RuntimeSpec, RuntimeTrainer, Step, TrainerType, TrainJob

# Trainer's resource aliases (kubeflow/sdk get_resources_per_node): lower-cased standard names, these aliases.
STANDARD_RESOURCES = ("cpu", "memory", "gpu", "storage", "ephemeral-storage")
RESOURCE_ALIASES = {"gpu": keys.GPU_RESOURCE, "storage": "ephemeral-storage"}
MIG_PREFIX = "nvidia.com/mig-"
REFUSED_TRAINERS = {
    "CustomTrainerContainer": "CustomTrainerContainer runs the image's own ENTRYPOINT, which trainhook's webhook "
                              "cannot read at admission to run under its launcher (docs/use/delivery.md): use "
                              "trainhook.TrainingClient().create_job(name, base_image=IMAGE, command=[...], "
                              "num_workers=N), naming the entrypoint as command",
    "BuiltinTrainer": "BuiltinTrainer (TorchTune post-training with Trainer's torchtune runtimes) has no trainhook "
                      "counterpart: write the fine-tuning as a CustomTrainer function (torchtune's recipes can be "
                      "called from it, with packages_to_install=['torchtune'])",
}


def runtime_spec(runtime: Any) -> tuple[RuntimeSpec, Runtime]:
    """The built-in runtime a `train(runtime=...)` names (None: torch-distributed, as Trainer's default), and the
    Runtime as given (its trainer.image and num_nodes are used)."""
    if runtime is None:
        spec = BUILTIN_RUNTIMES[DEFAULT_RUNTIME]
        return spec, spec.runtime()
    name = getattr(runtime, "name", runtime)
    if name not in BUILTIN_RUNTIMES:
        raise ValueError(f"runtime {name!r}: trainhook runs Trainer's built-in runtimes "
                         f"{', '.join(BUILTIN_RUNTIMES)} (list_runtimes()); there are no ClusterTrainingRuntimes "
                         "on a trainhook cluster. For another framework use trainhook.TrainingClient().create_job("
                         f"framework=...), one of {', '.join(keys.ROLES)}")
    spec = BUILTIN_RUNTIMES[name]
    return spec, runtime if isinstance(getattr(runtime, "trainer", None), RuntimeTrainer) else spec.runtime()


def node_resources(resources_per_node: Mapping | None) -> dict:
    """The training container's `resources` from Trainer's `resources_per_node`: each amount as request and
    limit; cpu, memory, gpu, storage, ephemeral-storage and mig-* lower-cased, `gpu` meaning nvidia.com/gpu,
    `storage` ephemeral-storage and `mig-<profile>` nvidia.com/mig-<profile>; other names (extended resources)
    kept as written."""
    if not resources_per_node:
        return {}
    if not isinstance(resources_per_node, Mapping):
        raise ValueError("resources_per_node must be a dict such as {'cpu': 2, 'memory': '8Gi', 'gpu': 1}")
    amounts: dict[str, Any] = {}
    for name, value in resources_per_node.items():
        lower = str(name).lower()
        key = lower if lower in STANDARD_RESOURCES or lower.startswith("mig-") else str(name)
        key = RESOURCE_ALIASES.get(key, key)
        if key.startswith("mig-"):
            key = MIG_PREFIX + key[len("mig-"):]
        if key in amounts:
            raise ValueError(f"resources_per_node: {key} given twice (gpu means {keys.GPU_RESOURCE})")
        amounts[key] = value
    migs = [key for key in amounts if key.startswith(MIG_PREFIX)]
    if len(migs) > 1 or (migs and keys.GPU_RESOURCE in amounts):
        raise ValueError(f"resources_per_node: {', '.join(migs + [k for k in amounts if k == keys.GPU_RESOURCE])}: "
                         "ask for one MIG profile, or whole GPUs, not both (as Trainer refuses)")
    return {"requests": dict(amounts), "limits": dict(amounts)}


def trainer_kind(trainer: Any) -> str:
    """The trainer's class name: Trainer's own classes (kubeflow.trainer) are accepted as well as trainhook's."""
    return type(trainer).__name__


def trainjob_manifests(name: str, trainer: Any, runtime: Any = None, namespace: str | None = None) -> list[dict]:
    """The manifests `TrainerClient.train` creates for a CustomTrainer on a built-in runtime."""
    if trainer is None:
        raise ValueError("train() needs trainer=CustomTrainer(func=...): a built-in runtime's own command only "
                         "prints its environment, and trainhook runs no runtime without a function")
    kind = trainer_kind(trainer)
    if kind in REFUSED_TRAINERS:
        raise ValueError(REFUSED_TRAINERS[kind])
    if kind != "CustomTrainer" or not hasattr(trainer, "func"):
        raise ValueError(f"trainer must be a CustomTrainer (from trainhook import CustomTrainer), not {kind}")
    spec, given = runtime_spec(runtime)
    nodes = trainer.num_nodes if trainer.num_nodes is not None else given.trainer.num_nodes
    if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1:
        raise ValueError(f"num_nodes={nodes!r}: give a whole number of nodes, at least 1")
    urls = list(getattr(trainer, "pip_index_urls", None) or [])
    command = function_command(trainer.func, trainer.func_args, spec.trainhook_framework,
                               trainer.packages_to_install, urls[0] if urls else None,
                               extra_index_urls=urls[1:], unpack=True)
    image = given.trainer.image or spec.image
    if spec.trainhook_framework == keys.MPI and spec.launcher_is_node:
        # one workload, every pod a worker, worker 0 launching: Trainer's runLauncherAsNode (docs/use/frameworks/mpi.md)
        objects = render(RenderOptions(name=name, framework=keys.MPI, roles=[("worker", nodes)], image=image,
                                       command=command, namespace=namespace))
    else:
        objects = job_manifests(name, command=command, base_image=image, num_workers=nodes,
                                framework=spec.trainhook_framework, namespace=namespace)
    resources = node_resources(trainer.resources_per_node)
    env = [{"name": str(k), "value": str(v)} for k, v in (trainer.env or {}).items()]
    for obj in objects:
        if obj["kind"] in ("StatefulSet", "Job"):
            container = obj["spec"]["template"]["spec"]["containers"][0]
            if resources:
                container["resources"] = resources
            if env:
                container["env"] = env
    return objects


# --- a gang read back as a TrainJob --------------------------------------------------------------------------

def runtime_of(state: GangState, workloads: list[dict]) -> Runtime:
    """The built-in runtime a gang's framework and layout correspond to (a gang made by the v1 SDK or by hand is
    read as well: tensorflow, paddle and mxnet gangs get a runtime named trainhook-<framework>)."""
    image = ""
    for workload in workloads:
        containers = workload.get("spec", {}).get("template", {}).get("spec", {}).get("containers") or [{}]
        image = image or containers[0].get("image", "")
    name = {keys.PYTORCH: "torch-distributed", keys.JAX: "jax-distributed",
            keys.XGBOOST: "xgboost-distributed"}.get(state.framework, "")
    if state.framework == keys.MPI:
        name = "mpi-distributed" if "launcher=" in state.shape else "deepspeed-distributed"
    if name:
        spec = BUILTIN_RUNTIMES[name]
        return Runtime(name, RuntimeTrainer(TrainerType.CUSTOM_TRAINER, spec.framework, image or spec.image,
                                            spec.num_nodes))
    framework = state.framework or UNKNOWN
    return Runtime(f"trainhook-{framework}", RuntimeTrainer(TrainerType.CUSTOM_TRAINER, framework, image))


def devices(pod: dict) -> tuple[str, str]:
    """(device, count) of a pod's training container, as Trainer reports a step's: GPUs, else TPUs, else CPUs
    from its limits, the count overridden by torchrun's processes per node when that is a number."""
    wanted = training_container_name(pod)
    container: dict = next((c for c in pod.get("spec", {}).get("containers") or [] if c.get("name") == wanted), {})
    limits = (container.get("resources") or {}).get("limits") or {}
    device, count = UNKNOWN, UNKNOWN
    for resource, word in ((keys.GPU_RESOURCE, "gpu"), ("google.com/tpu", "tpu"), ("cpu", "cpu")):
        if resource in limits:
            device, count = word, str(limits[resource])
            break
    for item in container.get("env") or []:
        if item.get("name") == keys.PET_NPROC_PER_NODE and str(item.get("value", "")).isdigit():
            count = str(item["value"])
    return device, count


def trainjob_of(state: GangState, workloads: list[dict], pods: list[dict]) -> TrainJob:
    """The TrainJob view of a gang: its runtime, a `node-<rank>` step per pod in rank order, the node count, the
    first workload's creation time, and the status (Created, Running, Complete, Failed)."""
    runtime = runtime_of(state, workloads)
    steps = []
    for pod in sorted(pods, key=lambda p: (pod_rank(p) is None, pod_rank(p) or 0, p["metadata"]["name"])):
        rank = pod_rank(pod)
        device, count = devices(pod)
        steps.append(Step(name=f"{NODE}-{'?' if rank is None else rank}", status=(pod.get("status") or {}).get(
            "phase"), pod_name=pod["metadata"]["name"], device=device, device_count=count))
    nodes = state.size - 1 if runtime.name == "mpi-distributed" else state.size
    created = [t for t in (parse_time(w["metadata"].get("creationTimestamp")) for w in workloads) if t]
    return TrainJob(name=state.name, runtime=runtime, steps=steps, num_nodes=nodes,
                    creation_timestamp=min(created) if created else None,
                    status=STATUS_OF_OUTCOME.get(state.outcome, UNKNOWN))


def step_rank(step: str) -> int:
    """`node-3` -> 3; Trainer's initializer steps have no trainhook counterpart."""
    prefix = f"{NODE}-"
    if step.startswith(prefix) and step[len(prefix):].isdigit():
        return int(step[len(prefix):])
    if step in ("dataset-initializer", "model-initializer"):
        raise ValueError(f"step {step!r}: trainhook gangs have no initializer steps (download inside the function)")
    raise ValueError(f"step {step!r}: give node-<rank>, e.g. node-0 (the steps are get_job(name).steps)")
