"""trainhook: distributed training on plain Kubernetes workloads.

The Python SDK (trainhook.sdk) is imported on first use: `trainhook.TrainingClient` (Kubeflow's v1 training SDK)
and `trainhook.TrainerClient` with `trainhook.CustomTrainer` (Kubeflow Trainer v2's), so importing trainhook (as
the webhook and the launcher do) loads nothing more than this file.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: every launcher start imports this file, and `typing` costs it ~4 ms of CPU
if TYPE_CHECKING:  # pragma: no cover
    from typing import Any

    from trainhook.sdk import CustomTrainer, JobFailed, KubernetesBackendConfig, TrainerClient, TrainingClient

__all__ = ["CustomTrainer", "JobFailed", "KubernetesBackendConfig", "TrainerClient", "TrainingClient"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from trainhook import sdk

        return getattr(sdk, name)
    raise AttributeError(f"module 'trainhook' has no attribute {name!r}")
