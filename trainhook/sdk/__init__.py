"""The Python SDK: `trainhook.TrainingClient` (core.py), Kubeflow's parameter names in trainhook's terms
(kubeflow.py) and a shipped function as a pod's command (command.py).

`from trainhook import TrainingClient` (docs/use/sdk.md) imports this package on first use; `from trainhook.sdk
import TrainingClient` names the same class.
"""

from trainhook.sdk.core import DEFAULT_BASE_IMAGE, JobFailed, TrainingClient, job_manifests, pod_resources

__all__ = ["DEFAULT_BASE_IMAGE", "JobFailed", "TrainingClient", "job_manifests", "pod_resources"]
