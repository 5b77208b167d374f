"""The Python SDK: `trainhook.TrainingClient` (core.py; Kubeflow v1's condition calls in conditions.py),
Kubeflow's parameter names in trainhook's terms (kubeflow.py), a shipped function as a pod's command (command.py),
and Trainer v2's `TrainerClient` and `CustomTrainer` (trainer_v2.py, trainer_types.py, trainer_manifests.py).

`from trainhook import TrainingClient` (docs/use/sdk.md) imports this package on first use; `from trainhook.sdk
import TrainingClient` names the same class.
"""

from trainhook.sdk.conditions import JobCondition
from trainhook.sdk.core import DEFAULT_BASE_IMAGE, JobFailed, TrainingClient, job_manifests, pod_resources
from trainhook.sdk.trainer_types import BuiltinTrainer, CustomTrainer, CustomTrainerContainer, Event, \
    KubernetesBackendConfig, Runtime, RuntimeTrainer, Step, TrainJob
from trainhook.sdk.trainer_v2 import TrainerClient

__all__ = ["DEFAULT_BASE_IMAGE", "BuiltinTrainer", "CustomTrainer", "CustomTrainerContainer", "Event", "JobCondition",
           "JobFailed", "KubernetesBackendConfig", "Runtime", "RuntimeTrainer", "Step", "TrainJob", "TrainerClient",
           "TrainingClient", "job_manifests", "pod_resources"]
