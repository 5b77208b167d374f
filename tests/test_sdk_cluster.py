"""`trainhook.TrainingClient` against a real Kubernetes API server with the real webhook: create, get, list,
logs, wait and delete (no kubelet: pods stay Pending; the outcome comes from the recorded phase)."""

from __future__ import annotations

import pytest

from conftest_cluster import control_plane, k8s_namespace  # noqa: F401
from test_cli_cluster import mutating_webhook, wait_for  # noqa: F401
from trainhook import JobFailed, TrainingClient
from trainhook.render import PHASE

pytestmark = pytest.mark.cluster


def train(args):
    import os
    print("rank", os.environ["RANK"], "lr", args["lr"])


def record_phase(control_plane, namespace: str, name: str, phase: str) -> None:  # noqa: F811
    from kubernetes import client
    with control_plane.api_client() as api:
        client.AppsV1Api(api).patch_namespaced_stateful_set(
            name, namespace, {"metadata": {"annotations": {PHASE: phase}}})


def test_create_get_list_logs_wait_delete(control_plane, k8s_namespace, mutating_webhook):  # noqa: F811
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
        record_phase(control_plane, k8s_namespace, "sdk", '{"phase": "Succeeded", "reason": "rank 0 exited 0"}')
        assert client.wait_for_job("sdk", timeout=10).outcome == "Succeeded"
        assert client.is_job_succeeded("sdk")
        record_phase(control_plane, k8s_namespace, "sdk", "Failed: sdk-2 exited 3")
        with pytest.raises(JobFailed) as failed:
            client.wait_for_job("sdk", timeout=10)
        assert failed.value.state.detail == "Failed: sdk-2 exited 3"

        assert client.delete_job("sdk") == ["statefulset/sdk", "service/sdk"]
        wait_for(lambda: client.get_job("sdk").outcome == "NotFound", what="the gang to be gone")
        assert client.list_jobs() == []


def test_the_namespace_comes_from_the_kubeconfig_context(control_plane, tmp_path):  # noqa: F811
    import yaml
    config = yaml.safe_load(control_plane.kubeconfig.read_text())
    config["contexts"][0]["context"]["namespace"] = "from-context"
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    assert TrainingClient(config_file=str(path)).namespace == "from-context"
    assert TrainingClient(config_file=str(path), namespace="given").namespace == "given"
