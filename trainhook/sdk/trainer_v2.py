"""`trainhook.TrainerClient`: Kubeflow Trainer v2's SDK calls (`kubeflow.trainer.TrainerClient`), on plain
labeled workloads instead of TrainJobs.

    from trainhook import TrainerClient, CustomTrainer      # was: from kubeflow.trainer import ...

    def train(lr):
        import os
        print("rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"], "lr", lr)

    client = TrainerClient()
    name = client.train(runtime=client.get_runtime("torch-distributed"),
                        trainer=CustomTrainer(func=train, func_args={"lr": 0.1}, num_nodes=2,
                                              resources_per_node={"cpu": 2, "memory": "4Gi"}))
    client.wait_for_job_status(name)
    print("\\n".join(client.get_job_logs(name)))
    client.delete_job(name)

Same names, arguments and return types as Trainer's (trainer_types.py); the work is the v1 surface's
(core.TrainingClient: its connection, manifests, logs and state), so both SDKs make the same gangs.
"""

from __future__ import annotations

import queue
import random
import string
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

from trainhook.cluster.status import container_started, gang_state, pod_rank, training_container_name
from trainhook.sdk.core import JobFailed, TrainingClient
from trainhook.sdk.trainer_manifests import step_rank, trainjob_manifests, trainjob_of
from trainhook.sdk.trainer_types import BUILTIN_RUNTIMES, COMPLETE, FAILED, STATUSES, CustomTrainer, Event, \
    KubernetesBackendConfig, Runtime, TrainJob

__all__ = ["CustomTrainer", "KubernetesBackendConfig", "TrainerClient"]
LOCAL_BACKENDS = ("LocalProcessBackendConfig", "ContainerBackendConfig")


def job_name() -> str:
    """A fresh TrainJob name as Trainer makes one: a letter and 11 hex digits."""
    return random.choice(string.ascii_lowercase) + uuid.uuid4().hex[:11]


class TrainerClient:
    """Train, follow and delete jobs with Trainer v2's calls; each job is a trainhook gang."""

    def __init__(self, backend_config: Any = None):
        """`backend_config`: a KubernetesBackendConfig (trainhook's, or Trainer's own: the same fields); None
        connects as kubectl does. Trainer's local backends are refused: `trainhook local` runs a gang locally."""
        config = backend_config or KubernetesBackendConfig()
        if type(config).__name__ in LOCAL_BACKENDS:
            raise ValueError(f"{type(config).__name__}: trainhook's TrainerClient runs on a cluster only; to run a "
                             "gang on this machine, write its manifests (trainhook.TrainingClient.job_manifests) and "
                             "run `trainhook local gang.yaml` (docs/use/local.md)")
        if not hasattr(config, "namespace"):
            raise ValueError(f"backend_config must be a KubernetesBackendConfig, not {type(config).__name__}")
        self.training = TrainingClient(config_file=getattr(config, "config_file", None),
                                       context=getattr(config, "context", None), namespace=config.namespace,
                                       client_configuration=getattr(config, "client_configuration", None))

    @property
    def namespace(self) -> str:
        return self.training.namespace

    def close(self) -> None:
        self.training.close()

    def __enter__(self) -> TrainerClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- runtimes ---------------------------------------------------------------------------------------------
    def list_runtimes(self) -> list[Runtime]:
        """Trainer's built-in runtimes that trainhook runs (no ClusterTrainingRuntimes are read: there are none)."""
        return [spec.runtime() for spec in BUILTIN_RUNTIMES.values()]

    def get_runtime(self, name: str) -> Runtime:
        if name not in BUILTIN_RUNTIMES:
            raise ValueError(f"runtime {name!r}: trainhook runs {', '.join(BUILTIN_RUNTIMES)}")
        return BUILTIN_RUNTIMES[name].runtime()

    def get_runtime_packages(self, runtime: Runtime) -> None:
        """Print the runtime image's Python and packages (and nvidia-smi), from a one-node job, as Trainer does."""
        def print_packages():
            import shutil
            import subprocess
            import sys
            print(f"Python: {sys.version}")
            if shutil.which("pip"):
                print(subprocess.run(["pip", "list"], capture_output=True, text=True).stdout)
            if shutil.which("nvidia-smi"):
                print(subprocess.run(["nvidia-smi"], capture_output=True, text=True).stdout)

        name = self.train(runtime, trainer=CustomTrainer(func=print_packages, num_nodes=1))
        try:
            self.wait_for_job_status(name)
            print("\n".join(self.get_job_logs(name)))
        finally:
            self.delete_job(name)

    # --- jobs -------------------------------------------------------------------------------------------------
    def train(self, runtime: Runtime | None = None, initializer: Any = None, trainer: Any = None,
              options: list | None = None) -> str:
        """Create the gang for `trainer` (a CustomTrainer) on `runtime` (default torch-distributed); returns its
        name, made as Trainer makes a TrainJob's."""
        if initializer is not None:
            raise ValueError("initializer=: trainhook gangs have no dataset or model initializer steps; download "
                             "inside the function (it runs on every node; guard with RANK == '0' and a shared "
                             "volume if it should run once)")
        if options:
            raise ValueError(f"options={[type(o).__name__ for o in options]}: Trainer's TrainJob options have no "
                             "counterpart here; for labels, annotations, a gang scheduler or a queue, make the "
                             "manifests with trainhook.TrainingClient.job_manifests(...) and create them with "
                             "create_job(job=manifests)")
        name = job_name()
        objects = trainjob_manifests(name, trainer, runtime)
        self.training.create_job(job=objects)
        return name

    def _read(self, name: str):
        cluster = self.training._in(None)
        objects = cluster.gang(name)
        state = gang_state(name, cluster.namespace, objects.workloads, objects.pods)
        return cluster, objects, state

    def get_job(self, name: str) -> TrainJob:
        """The job as a TrainJob; RuntimeError when there is no such gang, as Trainer raises."""
        cluster, objects, state = self._read(name)
        if state.outcome == "NotFound":
            raise RuntimeError(f"Failed to get TrainJob: {cluster.namespace}/{name}: no gang of that name "
                               f"(`trainhook list -n {cluster.namespace}` lists them)")
        return trainjob_of(state, objects.workloads, objects.pods)

    def list_jobs(self, runtime: Runtime | None = None) -> list[TrainJob]:
        """Every gang of the namespace as a TrainJob; with `runtime`, only those of that runtime."""
        cluster = self.training._in(None)
        jobs = [trainjob_of(gang_state(name, cluster.namespace, g.workloads, g.pods), g.workloads, g.pods)
                for name, g in cluster.gangs().items()]
        wanted = getattr(runtime, "name", runtime)
        return [job for job in jobs if wanted is None or job.runtime.name == wanted]

    def wait_for_job_status(self, name: str, status: set[str] | None = None, timeout: int = 600,
                            polling_interval: int = 2) -> TrainJob:
        """Wait until the job has one of `status` (default {"Complete"}); raises trainhook.JobFailed (a
        RuntimeError, as Trainer raises) when it fails and Failed is not wanted, TimeoutError after `timeout`."""
        wanted = set(status or {COMPLETE})
        if not wanted <= set(STATUSES):
            raise ValueError(f"Expected status {wanted} must be a subset of {set(STATUSES)}")
        if polling_interval > timeout:
            raise ValueError(f"Polling interval {polling_interval} must be less than timeout: {timeout}")
        deadline = time.monotonic() + timeout
        while True:
            cluster, objects, state = self._read(name)
            if state.outcome == "NotFound":
                raise RuntimeError(f"Failed to get TrainJob: {cluster.namespace}/{name}: no gang of that name")
            job = trainjob_of(state, objects.workloads, objects.pods)
            if job.status == FAILED and FAILED not in wanted:
                raise JobFailed(state)
            if job.status in wanted:
                return job
            if time.monotonic() >= deadline:
                raise TimeoutError(f"Timeout waiting for TrainJob {name} to reach status: {wanted} (it is "
                                   f"{job.status})")
            time.sleep(max(0.0, min(polling_interval, deadline - time.monotonic())))

    def get_job_logs(self, name: str, step: str = "node-0", follow: bool = False) -> Iterator[str]:
        """The log lines of one step (`node-<rank>`), as an iterator; with `follow`, as they are written (waiting
        for the pod to start). A step whose pod went after the gang finished (a StatefulSet gang is scaled to zero)
        gives the last lines kept with the outcome, when its rank's were kept (rank 0's always are)."""
        from trainhook.cluster.logs import POLL, RECORD_WAIT, kept_for, read_pod_log, state_of

        rank = step_rank(step)
        cluster = self.training._in(None)
        state, pods = state_of(cluster, name)
        pod = next((p for p in pods if pod_rank(p) == rank), None)
        while follow and pod is None and not state.finished and state.outcome != "NotFound" and rank < state.size:
            time.sleep(POLL)  # right after train(): the step's pod is not created yet
            state, pods = state_of(cluster, name)
            pod = next((p for p in pods if pod_rank(p) == rank), None)
        if pod is None:
            if state.finished:
                _, kept = kept_for(cluster, name, wait=0)
                yield from next((k.lines.splitlines() for k in kept if k.rank == rank), [])
            return
        lines: queue.Queue = queue.Queue()
        outcome: list = []

        def read() -> None:
            try:
                outcome.append(read_pod_log(cluster, pod, training_container_name(pod), follow, None, lines.put))
            except Exception as e:  # noqa: BLE001 - raised on the caller's thread below
                outcome.append(e)
            lines.put(None)

        if not follow and not container_started(pod, training_container_name(pod)):
            return  # a pending pod has no log yet, as Trainer skips it
        threading.Thread(target=read, daemon=True).start()
        while (line := lines.get()) is not None:
            yield line
        if isinstance(outcome[0], Exception):
            raise outcome[0]
        if outcome[0] is False:  # the pod went before its log could be read
            _, kept = kept_for(cluster, name, wait=RECORD_WAIT)
            yield from next((k.lines.splitlines() for k in kept if k.rank == rank), [])

    def get_job_events(self, name: str) -> list[Event]:
        """The Kubernetes Events of the gang's workloads, Service, PodGroup and pods (also pods already gone), oldest
        first (trainhook/sdk/events.py)."""
        from trainhook.sdk.events import read_events

        return read_events(self.training._in(None), name)

    def delete_job(self, name: str) -> None:
        """Delete the gang; RuntimeError when there is none of that name, as Trainer raises."""
        if not self.training.delete_job(name):
            raise RuntimeError(f"Failed to delete TrainJob: {self.namespace}/{name}: no gang of that name")
