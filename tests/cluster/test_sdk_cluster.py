"""`trainhook.TrainingClient` against a real Kubernetes API server with the real webhook: create, get, list,
logs, wait and delete (no kubelet: pods stay Pending; the outcome comes from the recorded phase)."""

from __future__ import annotations

import pytest

from test_cli_cluster import wait_for
from launcher_outcomes import decided, record
from trainhook import JobFailed, TrainingClient
from trainhook.gang import keys

pytestmark = pytest.mark.cluster


def train(args):
    import os
    print("rank", os.environ["RANK"], "lr", args["lr"])


def test_create_get_list_logs_wait_delete(control_plane, k8s_namespace, mutating_webhook):
    with TrainingClient(config_file=str(control_plane.kubeconfig), namespace=k8s_namespace) as client:
        created = client.create_job("sdk", func=train, func_args={"lr": 0.1}, num_workers=3,
                                    resources_per_worker={"cpu": "100m", "memory": "64Mi"})
        assert [(o["kind"], o["metadata"]["name"], o["metadata"]["namespace"]) for o in created] == [
            ("Service", "sdk", k8s_namespace), ("StatefulSet", "sdk", k8s_namespace)]
        assert created[0]["spec"]["publishNotReadyAddresses"] is True  # the webhook saw the Service

        state = wait_for(lambda: (lambda s: s if len(s.pods) == 3 else None)(client.get_job("sdk")), what="3 pods")
        assert [(p.name, p.rank, p.phase) for p in state.pods] == [
            ("sdk-0", 0, "Pending"), ("sdk-1", 1, "Pending"), ("sdk-2", 2, "Pending")]
        assert (state.framework, state.shape, state.outcome) == ("pytorch", "worker=3", "Pending")
        assert [s.name for s in client.list_jobs()] == ["sdk"]
        assert client.get_job_logs("sdk") == {}  # no container has started: no log to read
        assert not client.is_job_succeeded("sdk") and not client.is_job_failed("sdk")

        with pytest.raises(TimeoutError):
            client.wait_for_job("sdk", timeout=1, polling_interval=0.2)
        with control_plane.api_client() as api:  # what rank 0's launcher records, with its own writer
            record(api, "StatefulSet", "sdk", k8s_namespace, decided("sdk", size=3))
            assert client.wait_for_job("sdk", timeout=10).outcome == "Succeeded"
            assert client.is_job_succeeded("sdk")
            failure = decided("sdk", size=3, rank=2, code=3)
            record(api, "StatefulSet", "sdk", k8s_namespace, failure)
        with pytest.raises(JobFailed) as failed:
            client.wait_for_job("sdk", timeout=10)
        assert failed.value.state.detail == f"rank 2 (worker-2 at sdk-2.sdk) exited with 3 (exit 3) at {failure.time}"

        assert client.delete_job("sdk") == ["statefulset/sdk", "service/sdk"]
        wait_for(lambda: client.get_job("sdk").outcome == "NotFound", what="the gang to be gone")
        assert client.list_jobs() == []


def kubeconfig_in(control_plane, tmp_path, namespace: str):
    """The control plane's kubeconfig with its context in `namespace`, as a user's would be."""
    import yaml
    config = yaml.safe_load(control_plane.kubeconfig.read_text())
    config["contexts"][0]["context"]["namespace"] = namespace
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


def train_func(parameters=None):
    import torch.distributed as dist
    dist.init_process_group("nccl")


def test_a_kubeflow_users_call_creates_100_gpu_pods_wired_by_the_webhook(
        control_plane, k8s_namespace, mutating_webhook, tmp_path, monkeypatch):
    """The call as Kubeflow SDK users write it (job_kind included), against the API server: what it submits, what
    the API server stored after the webhook, and the 100 pods the StatefulSet controller made through it."""
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig_in(control_plane, tmp_path, k8s_namespace)))
    with TrainingClient() as client:
        created = client.create_job(name="seed", func=train_func, num_workers=100,
                                    resources_per_worker={"gpu": "2"}, job_kind="PyTorchJob")
        assert [(o["kind"], o["metadata"]["name"], o["metadata"]["namespace"]) for o in created] == [
            ("Service", "seed", k8s_namespace), ("StatefulSet", "seed", k8s_namespace)]
        service, sts = created
        assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
        assert (sts["spec"]["replicas"], sts["spec"]["podManagementPolicy"]) == (100, "Parallel")
        assert sts["metadata"]["labels"][keys.FRAMEWORK] == "pytorch"
        container = sts["spec"]["template"]["spec"]["containers"][0]
        assert container["resources"] == {"limits": {keys.GPU_RESOURCE: "2"}, "requests": {keys.GPU_RESOURCE: "2"}}

        state = wait_for(lambda: (lambda s: s if len(s.pods) == 100 else None)(client.get_job("seed")),
                         timeout=120, what="100 pods")
        assert [p.rank for p in state.pods] == list(range(100)) and state.shape == "worker=100"
        pods = {p["metadata"]["name"]: p for p in client.cluster.gang("seed").pods}
        for ordinal in range(100):
            pod = pods[f"seed-{ordinal}"]
            trainer = next(c for c in pod["spec"]["containers"] if c["name"] == "pytorch")
            assert trainer["resources"]["limits"] == {keys.GPU_RESOURCE: "2"}
            env = {e["name"]: e.get("value") for e in trainer["env"]}
            # one torchrun process per GPU; WORLD_SIZE counts pods (Kubeflow's rule without an integer
            # num_procs_per_worker), torchrun gives each of the 200 processes its own
            assert (env["RANK"], env["WORLD_SIZE"], env["PET_NNODES"], env["PET_NPROC_PER_NODE"]) == (
                str(ordinal), "100", "100", "2")
            assert env["MASTER_ADDR"] == "seed-0.seed"
            assert {"key": keys.GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"} in \
                pod["spec"]["tolerations"]
        assert client.delete_job("seed") == ["statefulset/seed", "service/seed"]


def test_the_namespace_comes_from_the_kubeconfig_context(control_plane, tmp_path):
    path = kubeconfig_in(control_plane, tmp_path, "from-context")
    assert TrainingClient(config_file=str(path)).namespace == "from-context"
    assert TrainingClient(config_file=str(path), namespace="given").namespace == "given"


def test_kubeflows_client_configuration_is_used_instead_of_a_kubeconfig(control_plane, k8s_namespace):
    from kubernetes import client, config
    configuration = client.Configuration()
    config.load_kube_config(config_file=str(control_plane.kubeconfig), client_configuration=configuration)
    with TrainingClient(config_file="/nonexistent", client_configuration=configuration,
                        namespace=k8s_namespace) as training:
        assert training.list_jobs() == [] and training.namespace == k8s_namespace
