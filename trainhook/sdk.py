"""`trainhook.TrainingClient`: the calls Kubeflow training SDK users know, on plain labeled workloads.

    from trainhook import TrainingClient

    def train(args):
        import os
        print("rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"], "lr", args["lr"])

    client = TrainingClient(namespace="team-a")
    client.create_job("mnist", func=train, func_args={"lr": 0.1}, num_workers=4,
                      resources_per_worker={"cpu": "2", "memory": "4Gi", "gpu": 1})
    client.wait_for_job("mnist", timeout=3600)
    print(client.get_job_logs("mnist")["mnist-0"])
    client.delete_job("mnist")

`TrainingClient.job_manifests(...)` (or `create_job(..., dry_run=True)`) returns the manifests without a
cluster; the connection is made on the first call that needs one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from trainhook import keys
from trainhook.gang_status import GangState, container_started, pod_rank, training_container_name
from trainhook.render import RenderOptions, Scheduling, render
from trainhook.sdk_command import function_command

DEFAULT_BASE_IMAGE = "docker.io/pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"
# Kubeflow's SDK accepts "gpu" for the NVIDIA device plugin's resource.
RESOURCE_ALIASES = {"gpu": keys.GPU_RESOURCE}


class JobFailed(RuntimeError):
    """wait_for_job: the gang failed; `.state` is its last state."""

    def __init__(self, state: GangState):
        super().__init__(f"gang {state.name} failed: {state.detail or 'see get_job_logs'}")
        self.state = state


def pod_resources(resources_per_worker: dict | None) -> dict:
    """Kubeflow's rule: every given resource as both request and limit ("gpu" is nvidia.com/gpu)."""
    if not resources_per_worker:
        return {}
    if not isinstance(resources_per_worker, dict):
        raise ValueError("resources_per_worker must be a dict such as {'cpu': '2', 'memory': '4Gi', 'gpu': 1}")
    amounts = {RESOURCE_ALIASES.get(name, name): value for name, value in resources_per_worker.items()}
    return {"requests": dict(amounts), "limits": dict(amounts)}


def job_manifests(name: str, func: Callable | None = None, func_args: dict | None = None,
                  base_image: str = DEFAULT_BASE_IMAGE, num_workers: int = 1,
                  resources_per_worker: dict | None = None, packages_to_install: list[str] | None = None,
                  pip_index_url: str | None = None, framework: str = keys.PYTORCH, namespace: str | None = None,
                  command: list[str] | None = None, env: dict[str, str] | None = None, kind: str = "statefulset",
                  num_chief_replicas: int = 0, num_ps_replicas: int = 0, gang_scheduler: str | None = None,
                  queue: str = "", priority_class: str = "") -> list[dict]:
    """The manifests of a gang: a function shipped in the command (or `command`), `num_workers` worker pods."""
    if (func is None) == (command is None):
        raise ValueError("give either func (a function to run on every pod) or command (a container command)")
    if num_workers < 0 or (num_workers + num_chief_replicas + num_ps_replicas) < 1:
        raise ValueError("the gang needs at least one pod (num_workers >= 1)")
    roles = [(role, count) for role, count in (("chief", num_chief_replicas), ("ps", num_ps_replicas),
                                               ("worker", num_workers)) if count]
    if framework == keys.MPI:
        roles = [("launcher", 1)] + roles
    if func is not None:
        command = function_command(func, func_args, framework, packages_to_install, pip_index_url)
    scheduling = Scheduling(gang_scheduler, queue=queue, priority_class=priority_class) if gang_scheduler else None
    options = RenderOptions(name=name, framework=framework, roles=roles, image=base_image, command=list(command or []),
                            env=sorted((env or {}).items()), namespace=namespace, kind=kind, scheduling=scheduling,
                            priority_class="" if scheduling else priority_class)
    objects = render(options)
    resources = pod_resources(resources_per_worker)
    for obj in objects:
        if resources and obj["kind"] in ("StatefulSet", "Job"):
            obj["spec"]["template"]["spec"]["containers"][0]["resources"] = resources
    return objects


class TrainingClient:
    """Create, follow and delete training gangs; Kubeflow's TrainingClient calls, trainhook's workloads."""

    def __init__(self, config_file: str | None = None, context: str | None = None, namespace: str | None = None):
        self.config_file = config_file
        self.context = context
        self._namespace = namespace
        self._cluster = None
        self._lock = threading.Lock()

    job_manifests = staticmethod(job_manifests)

    @property
    def cluster(self):
        """The connection, made on first use (a kubeconfig, else in-cluster)."""
        with self._lock:
            if self._cluster is None:
                from trainhook.cluster_client import Cluster

                self._cluster = Cluster.connect(self.config_file, self.context, self._namespace)
            return self._cluster

    @property
    def namespace(self) -> str:
        return self._namespace or self.cluster.namespace

    def _in(self, namespace: str | None):
        from trainhook.cluster_client import Cluster

        cluster = self.cluster
        return cluster if namespace in (None, cluster.namespace) else Cluster(cluster.api_client, namespace)

    def close(self) -> None:
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None

    def __enter__(self) -> "TrainingClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def create_job(self, name: str | None = None, func: Callable | None = None, func_args: dict | None = None,
                   base_image: str = DEFAULT_BASE_IMAGE, num_workers: int = 1,
                   resources_per_worker: dict | None = None, packages_to_install: list[str] | None = None,
                   framework: str = keys.PYTORCH, namespace: str | None = None, job: list[dict] | None = None,
                   dry_run: bool = False, train_func: Callable | None = None, parameters: dict | None = None,
                   **options) -> list[dict]:
        """Create a gang from a function (`func`, or Kubeflow's `train_func`/`parameters`), a `command=`, or
        ready manifests (`job=`); returns the objects created (with `dry_run`, the manifests only)."""
        func = func or train_func
        func_args = func_args if func_args is not None else parameters
        if job is None:
            if not name:
                raise ValueError("create_job needs a name (or job=[manifests])")
            job = job_manifests(name, func=func, func_args=func_args, base_image=base_image,
                                num_workers=num_workers, resources_per_worker=resources_per_worker,
                                packages_to_install=packages_to_install, framework=framework,
                                namespace=namespace, **options)
        if dry_run:
            return job
        cluster = self._in(namespace)
        return [cluster.create(obj) for obj in job]

    def get_job(self, name: str, namespace: str | None = None) -> GangState:
        """The gang's state: pods in rank order with phases and restarts, and its outcome."""
        from trainhook.cluster_client import gang_state_of

        return gang_state_of(self._in(namespace), name)

    def list_jobs(self, namespace: str | None = None) -> list[GangState]:
        from trainhook.gang_status import gang_state

        cluster = self._in(namespace)
        return [gang_state(name, cluster.namespace, g.workloads, g.pods) for name, g in cluster.gangs().items()]

    def is_job_succeeded(self, name: str, namespace: str | None = None) -> bool:
        return self.get_job(name, namespace).outcome == "Succeeded"

    def is_job_failed(self, name: str, namespace: str | None = None) -> bool:
        return self.get_job(name, namespace).outcome == "Failed"

    def get_job_logs(self, name: str, namespace: str | None = None, container: str | None = None,
                     follow: bool = False, tail: int | None = None) -> dict[str, str]:
        """Each pod's log (the training container's, or `container`'s), by pod name in rank order; pods whose
        container has not started yet are left out. With `follow`, waits for the logs to end."""
        cluster = self._in(namespace)
        pods = sorted(cluster.gang(name).pods, key=lambda p: (pod_rank(p) is None, pod_rank(p) or 0))
        logs: dict[str, str] = {p["metadata"]["name"]: "" for p in pods}

        def read(pod: dict) -> None:
            wanted = container or training_container_name(pod)
            if not follow and not container_started(pod, wanted):
                logs.pop(pod["metadata"]["name"], None)
                return
            lines = cluster.log_lines(pod["metadata"]["name"], wanted, follow, tail)
            logs[pod["metadata"]["name"]] = "".join(line + "\n" for line in lines)

        threads = [threading.Thread(target=read, args=(pod,), daemon=True) for pod in pods]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return logs

    def wait_for_job(self, name: str, namespace: str | None = None, timeout: float | None = 600,
                     polling_interval: float = 2.0, verbose: bool = False) -> GangState:
        """Wait until the gang succeeds (returns its state) or fails (raises JobFailed); TimeoutError after
        `timeout` seconds."""
        from trainhook.cluster_client import wait_for_gang

        report = (lambda lines: print("\n".join(lines), flush=True)) if verbose else None
        state = wait_for_gang(self._in(namespace), name, timeout, polling_interval, report)
        if state.outcome == "Failed":
            raise JobFailed(state)
        return state

    def delete_job(self, name: str, namespace: str | None = None) -> list[str]:
        """Delete the gang's workloads (and pods), Service and PodGroup; returns `kind/name` of each."""
        return self._in(namespace).delete_gang(name)
