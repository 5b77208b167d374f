"""Issue 32: the variables that list every member in every pod (TF_CONFIG, MX_CONFIG, WORKER_ADDRS) are refused above
1,000 members, at `kubectl apply` of the workload, through the real API server and the real webhook; and a gang
within the count whose host names make the list longer than Linux lets a process start with (128 KiB, execve's
E2BIG) is refused at its pod's admission, instead of a container that can never start. The size and why:
trainhook/webhook/admission/frameworks/__init__.py."""

from __future__ import annotations

import json

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from trainhook.webhook.admission.frameworks import MAX_ARG_STRLEN, MAX_LISTED_MEMBERS


def statefulset(name: str, framework: str, role: str, replicas: int, shape: str | None = None) -> dict:
    annotations = {"trainhook.dev/replicas": shape} if shape else {}
    return {"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": name, "labels": {"trainhook.dev/framework": framework, "trainhook.dev/role": role,
                                                  "trainhook.dev/job-name": name.rsplit("-", 1)[0]},
                         "annotations": annotations},
            "spec": {"replicas": replicas, "serviceName": name.rsplit("-", 1)[0], "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{"name": "main", "image": "example.com/train:1",
                                                           "command": ["python", "train.py"]}]}}}}


def refusal(api, namespace: str, body: dict) -> str:
    try:
        client.AppsV1Api(api).create_namespaced_stateful_set(namespace, body, dry_run="All")
    except ApiException as e:
        return json.loads(e.body)["message"]
    raise AssertionError(f"{body['metadata']['name']} was admitted")


@pytest.mark.parametrize("framework, role, shape, variable", [
    ("tensorflow", "worker", "chief=1,worker=1000", "TF_CONFIG"),
    ("mxnet", "worker", "scheduler=1,server=1,worker=999", "MX_CONFIG"),
    ("xgboost", "worker", "master=1,worker=1000", "WORKER_ADDRS"),
])
def test_a_gang_that_lists_every_member_is_refused_above_1000_members_and_admitted_at_it(
        control_plane, mutating_webhook, k8s_namespace, framework, role, shape, variable):
    with control_plane.api_client() as api:
        workers = int(shape.rsplit("=", 1)[1])
        message = refusal(api, k8s_namespace, statefulset("big-worker", framework, role, workers, shape))
        assert f"{variable} lists every member in every pod, so a gang of 1001" in message, message
        assert f"use at most {MAX_LISTED_MEMBERS} members in a {framework} gang" in message, message
        assert "O(1) per pod" in message
        at_limit = shape.replace(f"={workers}", f"={workers - 1}")
        created = client.AppsV1Api(api).create_namespaced_stateful_set(
            k8s_namespace, statefulset("limit-worker", framework, role, workers - 1, at_limit), dry_run="All")
        assert created.spec.template.metadata.annotations["trainhook.dev/replicas"] == at_limit


def test_a_list_longer_than_the_kernel_starts_a_process_with_is_refused_at_the_pods_admission(
        control_plane, mutating_webhook, k8s_namespace):
    """1,000 members whose addresses are ~140 bytes each (63-character host names and subdomain): TF_CONFIG would
    be ~140 KB. A bare pod, as the pods of such a workload are admitted."""
    job = "j" * 50
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": f"{job}-worker-0", "labels": {
               "trainhook.dev/framework": "tensorflow", "trainhook.dev/role": "worker", "trainhook.dev/job-name": job,
               "trainhook.dev/index": "0"}, "annotations": {"trainhook.dev/replicas": "worker=1000"}},
           "spec": {"hostname": f"{job}-worker-0", "subdomain": "s" * 63,
                    "containers": [{"name": "main", "image": "example.com/train:1",
                                    "command": ["python", "train.py"]}]}}
    with control_plane.api_client() as api:
        with pytest.raises(ApiException) as refused:
            client.CoreV1Api(api).create_namespaced_pod(k8s_namespace, pod, dry_run="All")
        message = json.loads(refused.value.body)["message"]
        assert f"environment string over {MAX_ARG_STRLEN} bytes (execve: E2BIG" in message, message
        assert "shorten the job name" in message
        pod["spec"]["subdomain"] = "s"
        pod["metadata"]["labels"]["trainhook.dev/job-name"] = "j"
        pod["spec"]["hostname"] = "j-worker-0"
        admitted = client.CoreV1Api(api).create_namespaced_pod(k8s_namespace, pod, dry_run="All")
        env = {e.name: e.value for e in admitted.spec.containers[0].env or []}
        assert len(json.loads(env["TF_CONFIG"])["cluster"]["worker"]) == 1000
