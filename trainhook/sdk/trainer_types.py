"""Kubeflow Trainer v2's SDK types (`kubeflow.trainer`), with the same names and fields, for trainhook's
`TrainerClient` (trainer_v2.py).

A notebook written for Trainer v2 builds a `CustomTrainer(func, func_args, num_nodes, resources_per_node,
packages_to_install, env)`, picks a `Runtime` from `list_runtimes()`/`get_runtime()`, and reads `TrainJob`s, `Step`s
and `Event`s back; the same classes are here so only its import changes. There are no TrainJob or
ClusterTrainingRuntime objects on a trainhook cluster: a runtime is one of BUILTIN_RUNTIMES (the frameworks
trainhook wires, named as Trainer's built-in runtimes), and a TrainJob is read from the gang's plain workloads.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import Any

from trainhook.gang import keys

UNKNOWN = "Unknown"  # Trainer's value for a device it cannot tell
NODE = "node"  # a step's name is node-<rank>, as Trainer names a TrainJob's trainer pods
# A TrainJob's statuses (Trainer's constants): Created until every node runs, Running, then Complete or Failed.
CREATED, RUNNING, COMPLETE, FAILED = "Created", "Running", "Complete", "Failed"
STATUSES = (CREATED, RUNNING, COMPLETE, FAILED)
# A gang's outcome (trainhook.cluster.status) as a TrainJob's status.
STATUS_OF_OUTCOME = {"Pending": CREATED, "Starting": CREATED, "Running": RUNNING, "Succeeded": COMPLETE,
                     "Failed": FAILED}


def default_pip_index_urls() -> list[str]:
    """Trainer's DEFAULT_PIP_INDEX_URLS (comma-separated) when set; otherwise none, so pip uses the image's own
    configuration (a mirror in pip.conf keeps working) rather than forcing pypi.org as Trainer does."""
    value = os.environ.get("DEFAULT_PIP_INDEX_URLS", "")
    return [url for url in value.split(",") if url]


@dataclass
class CustomTrainer:
    """A self-contained function run on every node: `func(**func_args)` under torchrun (or python, or mpirun, as
    the runtime says), `num_nodes` pods, each with `resources_per_node` and `env`."""

    func: Callable
    func_args: dict | None = None
    packages_to_install: list[str] | None = None
    pip_index_urls: list[str] = field(default_factory=default_pip_index_urls)
    num_nodes: int | None = None
    resources_per_node: dict | None = None
    env: dict[str, str] | None = None


@dataclass
class CustomTrainerContainer:
    """Trainer's image-only trainer: accepted as a type so the refusal can say what to do instead."""

    image: str
    num_nodes: int | None = None
    resources_per_node: dict | None = None
    env: dict[str, str] | None = None


@dataclass
class BuiltinTrainer:
    """Trainer's TorchTune post-training: accepted as a type so the refusal can say what to do instead."""

    config: Any = None


class TrainerType(Enum):
    CUSTOM_TRAINER = "CustomTrainer"
    BUILTIN_TRAINER = "BuiltinTrainer"


@dataclass
class RuntimeTrainer:
    """What a runtime runs: Trainer's framework name (torch, deepspeed, mpi, jax, xgboost), the image a
    CustomTrainer's function runs in, and the default node count. Set `image` on a runtime from get_runtime() to
    run in your own image: trainhook has no ClusterTrainingRuntime to edit instead."""

    trainer_type: TrainerType
    framework: str
    image: str
    num_nodes: int = 1
    device: str = UNKNOWN
    device_count: str = UNKNOWN


@dataclass
class Runtime:
    name: str
    trainer: RuntimeTrainer
    pretrained_model: str | None = None


@dataclass(frozen=True)
class RuntimeSpec:
    """How trainhook runs one of Trainer's built-in runtimes: its trainhook framework and MPI layout."""

    name: str
    framework: str  # Trainer's trainer.kubeflow.org/framework label
    trainhook_framework: str
    image: str
    num_nodes: int = 1
    # MPI: the launcher is node-0 and one of the num_nodes (deepspeed-distributed's runLauncherAsNode), so the gang
    # is one workload whose worker 0 launches; otherwise a launcher pod beside num_nodes workers (mpi-distributed).
    launcher_is_node: bool = False

    def runtime(self) -> Runtime:
        return Runtime(self.name, RuntimeTrainer(TrainerType.CUSTOM_TRAINER, self.framework, self.image,
                                                 self.num_nodes))


# Trainer's built-in ClusterTrainingRuntimes (kubeflow/trainer manifests/base/runtimes; the same images and node
# counts as trainhook/convert/runtimes.py's transcriptions), each run as the trainhook framework that wires what that
# runtime's MLPolicy wires.
BUILTIN_RUNTIMES = {spec.name: spec for spec in (
    RuntimeSpec("torch-distributed", "torch", keys.PYTORCH, "pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime"),
    RuntimeSpec("deepspeed-distributed", "deepspeed", keys.MPI, "ghcr.io/kubeflow/trainer/deepspeed-runtime",
                launcher_is_node=True),
    RuntimeSpec("mpi-distributed", "mpi", keys.MPI, "mpioperator/mpi-pi:openmpi"),
    RuntimeSpec("jax-distributed", "jax", keys.JAX, "nvcr.io/nvidia/jax:25.10-py3"),
    RuntimeSpec("xgboost-distributed", "xgboost", keys.XGBOOST, "ghcr.io/kubeflow/trainer/xgboost-runtime:v2.2.5"),
)}
DEFAULT_RUNTIME = "torch-distributed"


@dataclass
class Step:
    """One pod of a TrainJob: `node-<rank>`, its phase, its pod, and the device it asked for."""

    name: str
    status: str | None
    pod_name: str
    device: str = UNKNOWN
    device_count: str = UNKNOWN


@dataclass
class TrainJob:
    name: str
    runtime: Runtime
    steps: list[Step]
    num_nodes: int
    creation_timestamp: datetime | None
    status: str = UNKNOWN


@dataclass
class Event:
    involved_object_kind: str
    involved_object_name: str
    message: str
    reason: str
    event_time: datetime | None


@dataclass
class KubernetesBackendConfig:
    """Where TrainerClient connects, as Trainer's: a kubeconfig (and context), or a kubernetes.client
    Configuration; `namespace` defaults to the context's."""

    namespace: str | None = None
    config_file: str | None = None
    context: str | None = None
    client_configuration: Any = None
