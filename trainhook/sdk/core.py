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
import warnings
from collections.abc import Callable
from typing import Any

from trainhook.convert.core import convert_job
from trainhook.cluster.status import GangState, container_started, training_container_name
from trainhook.render.objects import Scheduling
from trainhook.render.options import RenderOptions, render
from trainhook.sdk.command import function_command
from trainhook.sdk.conditions import ConditionCalls, JobFailed, select_pods
from trainhook.sdk.kubeflow import JOB_KINDS, env_entries, framework_of, job_only, kubeflow_job, nproc_per_node, \
    one_of, pod_resources, replica_roles

DEFAULT_BASE_IMAGE = "docker.io/pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"
__all__ = ["DEFAULT_BASE_IMAGE", "JobFailed", "TrainingClient", "job_manifests", "pod_resources"]


def job_manifests(name: str, func: Callable | None = None, func_args: dict | None = None,
                  base_image: str | None = None, num_workers: int | None = None,
                  resources_per_worker: Any = None, packages_to_install: list[str] | None = None,
                  pip_index_url: str | None = None, framework: str | None = None, namespace: str | None = None,
                  command: list[str] | None = None, env: dict[str, str] | None = None, kind: str = "statefulset",
                  num_chief_replicas: int | None = None, num_ps_replicas: int | None = None,
                  gang_scheduler: str | None = None, queue: str = "", priority_class: str = "", *,
                  job_kind: str | None = None, train_func: Callable | None = None, parameters: dict | None = None,
                  num_procs_per_worker: int | str | None = None, env_vars: Any = None,
                  num_worker_replicas: int | None = None) -> list[dict]:
    """The manifests of a gang: a function shipped in the command (or `command`, or the image's own entrypoint),
    `num_workers` worker pods. Kubeflow's names (`job_kind`, `train_func`, `parameters`, `env_vars`,
    `num_procs_per_worker`, `num_worker_replicas`) mean what they mean to Kubeflow's SDK, so code written for it
    makes the same pods here (trainhook/sdk/kubeflow.py)."""
    framework = framework_of(job_kind, framework)
    func = one_of("train_func", train_func, "func", func)
    func_args = one_of("parameters", parameters, "func_args", func_args)
    num_workers = one_of("num_worker_replicas", num_worker_replicas, "num_workers", num_workers)
    if func is not None and command is not None:
        raise ValueError("give func (a function to run on every pod) or command (a container command), not both")
    if func is None and command is None and base_image is None:
        raise ValueError("give func= (a function to run on every pod), command= (a container command), or "
                         "base_image= with command= (an image whose own entrypoint trains)")
    if func is None and command is None:
        raise ValueError(f"base_image={base_image!r} alone would run the image's ENTRYPOINT, which trainhook's "
                         "webhook cannot read at admission to run it under its launcher (docs/use/delivery.md): give "
                         "that entrypoint as command=, e.g. command=['python', '/app/train.py']")
    roles = replica_roles(framework, num_workers, num_chief_replicas, num_ps_replicas)
    if func is not None:
        command = function_command(func, func_args, framework, packages_to_install, pip_index_url)
    scheduling = Scheduling(gang_scheduler, queue=queue, priority_class=priority_class) if gang_scheduler else None
    options = RenderOptions(name=name, framework=framework, roles=roles, image=base_image or DEFAULT_BASE_IMAGE,
                            command=list(command or []), namespace=namespace, kind=kind, scheduling=scheduling,
                            nproc_per_node=nproc_per_node(num_procs_per_worker, framework),
                            priority_class="" if scheduling else priority_class)
    objects = render(options)
    resources = pod_resources(resources_per_worker)
    entries = env_entries(env, env_vars)
    for obj in objects:
        if obj["kind"] in ("StatefulSet", "Job"):
            container = obj["spec"]["template"]["spec"]["containers"][0]
            if resources:
                container["resources"] = resources
            if entries:
                container["env"] = entries
    return objects


def submitted_objects(job: Any, namespace: str | None) -> list[dict]:
    """What `create_job(job=...)` creates: trainhook's manifests as they are, or a Kubeflow job converted as
    `trainhook convert` converts it (what it cannot carry over is warned about, never dropped silently)."""
    found = kubeflow_job(job)
    if found is not None:
        converted = convert_job(found, namespace=namespace)
        for warning in converted.warnings:
            warnings.warn(warning, stacklevel=3)
        return converted.objects
    if isinstance(job, (list, tuple)) and all(isinstance(obj, dict) for obj in job):
        return list(job)
    raise ValueError("job= is a list of manifests (from job_manifests, trainhook render or convert) or a Kubeflow "
                     f"job (KubeflowOrgV1PyTorchJob, ... or its dict), not {type(job).__name__}")


class TrainingClient(ConditionCalls):
    """Create, follow and delete training gangs; Kubeflow's TrainingClient calls, trainhook's workloads (the
    condition calls and pod selection are conditions.py's)."""

    def __init__(self, config_file: str | None = None, context: str | None = None, namespace: str | None = None,
                 job_kind: str | None = None, client_configuration: Any = None):
        """`job_kind` (Kubeflow's: "PyTorchJob", "TFJob", ...) is the framework `create_job` uses when a call names
        none; `client_configuration` (a kubernetes.client.Configuration) is used instead of a kubeconfig."""
        framework_of(job_kind, None)  # an unknown kind is refused now, not at the first create_job
        self.config_file = config_file
        self.context = context
        self.job_kind = job_kind
        self.client_configuration = client_configuration
        self._namespace = namespace
        self._cluster: Any = None  # a trainhook.cluster.client.Cluster once connected
        self._lock = threading.Lock()

    job_manifests = staticmethod(job_manifests)

    @property
    def cluster(self):
        """The connection, made on first use (a kubeconfig, else in-cluster)."""
        with self._lock:
            if self._cluster is None:
                from trainhook.cluster.client import Cluster

                if self.client_configuration is not None:
                    from kubernetes import client

                    self._cluster = Cluster(client.ApiClient(self.client_configuration), self._namespace or "default")
                else:
                    self._cluster = Cluster.connect(self.config_file, self.context, self._namespace)
            return self._cluster

    @property
    def namespace(self) -> str:
        return self._namespace or self.cluster.namespace

    def _in(self, namespace: str | None):
        from trainhook.cluster.client import Cluster

        cluster = self.cluster
        return cluster if namespace in (None, cluster.namespace) else Cluster(cluster.api_client, namespace)

    def close(self) -> None:
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None

    def __enter__(self) -> TrainingClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def create_job(self, name: Any = None, func: Callable | None = None, func_args: dict | None = None,
                   base_image: str | None = None, num_workers: int | None = None, resources_per_worker: Any = None,
                   packages_to_install: list[str] | None = None, framework: str | None = None,
                   namespace: str | None = None, job: Any = None, dry_run: bool = False, *,
                   job_kind: str | None = None, **options) -> list[dict]:
        """Create a gang from a function (`func`, or Kubeflow's `train_func`/`parameters`), a `command=` (with
        `base_image=`: an image's entrypoint, named, since `base_image=` alone is refused), or ready manifests (`job=`,
        also a Kubeflow job, which is converted);
        returns the objects created (with `dry_run`, the manifests only). Every other keyword is job_manifests'.
        As in Kubeflow's SDK, the first argument may be the job itself."""
        if name is not None and not isinstance(name, str):
            if job is not None:
                raise ValueError("the first argument is the job here, and job= was given too: give one")
            name, job = None, name
        if job is not None:
            job_only({"name": name, "func": func, "func_args": func_args, "base_image": base_image,
                      "num_workers": num_workers, "resources_per_worker": resources_per_worker,
                      "packages_to_install": packages_to_install, "framework": framework, "job_kind": job_kind,
                      **options})
            objects = submitted_objects(job, namespace)
        else:
            if not name:
                raise ValueError("create_job needs a name (or job=[manifests], or a Kubeflow job)")
            if job_kind is None and framework is None:
                job_kind = self.job_kind
            objects = job_manifests(name, func=func, func_args=func_args, base_image=base_image,
                                    num_workers=num_workers, resources_per_worker=resources_per_worker,
                                    packages_to_install=packages_to_install, framework=framework,
                                    namespace=namespace, job_kind=job_kind, **options)
        if dry_run:
            return objects
        cluster = self._in(namespace)
        return [cluster.create(obj) for obj in objects]

    def get_job(self, name: str, namespace: str | None = None) -> GangState:
        """The gang's state: pods in rank order with phases and restarts, and its outcome."""
        from trainhook.cluster.client import gang_state_of

        return gang_state_of(self._in(namespace), name)

    def list_jobs(self, namespace: str | None = None) -> list[GangState]:
        from trainhook.cluster.status import gang_state

        cluster = self._in(namespace)
        return [gang_state(name, cluster.namespace, g.workloads, g.pods) for name, g in cluster.gangs().items()]

    def get_job_logs(self, name: str, namespace: str | None = None, container: str | None = None,
                     follow: bool = False, tail: int | None = None, *, job_kind: str | None = None,
                     is_master: bool = False, replica_type: str | None = None, replica_index: int | None = None,
                     timeout: int | None = None, verbose: bool = False) -> Any:
        """Each pod's log (the training container's, or `container`'s), by pod name in rank order; pods whose
        container has not started yet are left out. With `follow`, waits for the gang's pods and their containers
        to start (through PodInitializing: right after create_job is fine) and for the logs to end. A pod that went
        before its log could be read (a finished StatefulSet gang is scaled to zero, maybe while this reads) is
        given the last lines kept with the gang's outcome (the deciding rank's and rank 0's;
        trainhook/cluster/logs.py), and so is every kept rank of a finished gang without pods.
        Kubeflow's selection: `is_master` (rank 0, or the master/chief/launcher pod), `replica_type`,
        `replica_index` (conditions.select_pods); `verbose` returns (logs, events) as Kubeflow v1.8+ does, the events
        as {"Kind name": ["time message", ...]}. Kubeflow's third positional argument is `job_kind`: a kind given
        there is taken as one."""
        from trainhook.cluster.logs import RECORD_WAIT, in_rank_order, kept_for, kept_label, kept_of_pod, \
            read_pod_log, state_of, wait_for_pods

        if container in JOB_KINDS:  # get_job_logs(name, namespace, "PyTorchJob"), Kubeflow's order
            job_kind, container = container, None
        framework_of(job_kind, None)
        selecting = is_master or replica_type is not None or replica_index is not None
        cluster = self._in(namespace)
        state, pods = wait_for_pods(cluster, name) if follow else state_of(cluster, name)
        pods = select_pods(in_rank_order(pods), is_master, replica_type, replica_index)
        logs: dict[str, str] = {p["metadata"]["name"]: "" for p in pods}
        missed: list[dict] = []
        failures: list[Exception] = []

        def read(pod: dict) -> None:
            wanted = container or training_container_name(pod)
            if not follow and not container_started(pod, wanted):
                logs.pop(pod["metadata"]["name"], None)
                return
            lines: list[str] = []
            try:
                if not read_pod_log(cluster, pod, wanted, follow, tail, lines.append):
                    missed.append(pod)
            except Exception as e:  # noqa: BLE001 - raised on the caller's thread below
                failures.append(e)
            logs[pod["metadata"]["name"]] = "".join(line + "\n" for line in lines)

        threads = [threading.Thread(target=read, args=(pod,), daemon=True) for pod in pods]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if failures:
            raise failures[0]
        if missed or (not pods and state.finished):
            _, kept = kept_for(cluster, name, wait=0 if not pods else RECORD_WAIT)
            for entry in (kept if not pods else [k for k in map(lambda p: kept_of_pod(kept, p), missed) if k]):
                if not pods and selecting and not (is_master and entry.rank == 0):
                    continue  # without pods only rank 0 (the master) can be told apart
                logs[kept_label(entry)] = entry.lines + "\n"
        if verbose:
            from trainhook.sdk.events import read_events

            events: dict[str, list[str]] = {}
            for event in read_events(cluster, name):
                when = event.event_time.strftime("%Y-%m-%d %H:%M:%S") if event.event_time else "-"
                events.setdefault(f"{event.involved_object_kind} {event.involved_object_name}", []).append(
                    f"{when} {event.message}")
            return logs, events
        return logs

    def wait_for_job(self, name: str, namespace: str | None = None, timeout: float | None = 600,
                     polling_interval: float = 2.0, verbose: bool = False) -> GangState:
        """Wait until the gang succeeds (returns its state) or fails (raises JobFailed); TimeoutError after
        `timeout` seconds."""
        from trainhook.cluster.client import wait_for_gang

        report = (lambda lines: print("\n".join(lines), flush=True)) if verbose else None
        state = wait_for_gang(self._in(namespace), name, timeout, polling_interval, report)
        if state.outcome == "Failed":
            raise JobFailed(state)
        return state

    def delete_job(self, name: str, namespace: str | None = None) -> list[str]:
        """Delete the gang's workloads (and pods), Service and PodGroup; returns `kind/name` of each."""
        return self._in(namespace).delete_gang(name)
