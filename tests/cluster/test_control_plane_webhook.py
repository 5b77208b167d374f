"""The webhook behind a real kube-apiserver (v1.20.2, started by the tests): the API server calls it, applies its
patches, and the StatefulSet controller's pods come out wired.

What this real cluster cannot cover, and where it is covered instead:
- no kubelet runs pods here: pods stay Pending (training runs are covered by `trainhook local` tests);
- Kubernetes 1.20 has no Indexed Jobs (the API server drops `completionMode`): the refusal of such pods is
  tested below; Indexed Job wiring is covered by the HTTPS and mutation tests;
- no `apps.kubernetes.io/pod-index` label (1.28+) and no native sidecars: trainhook needs neither.
"""

from __future__ import annotations

import base64
import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from chart_render import find, render_chart
from helpers import wait_for
from webhook_process import start_webhook

ROOT = Path(__file__).resolve().parents[2]
CONFIG_NAME = "trainhook-test"


def chart_webhook_configuration(url: str, ca_pem: bytes) -> dict:
    """The chart's own MutatingWebhookConfiguration, pointed at the test's server by URL."""
    config = find(render_chart({"certificates": {"mode": "secret", "secretName": "tls",
                                                 "caBundle": base64.b64encode(ca_pem).decode()}}),
                  "MutatingWebhookConfiguration")
    config["metadata"] = {"name": CONFIG_NAME}
    for webhook in config["webhooks"]:
        webhook["clientConfig"] = {"url": url + "/mutate", "caBundle": base64.b64encode(ca_pem).decode()}
    return config


@pytest.fixture(scope="module")
def wired_cluster(control_plane, tmp_path_factory):
    """The control plane with the real webhook registered through the chart's configuration."""
    workdir = tmp_path_factory.mktemp("cp-webhook")
    hook = start_webhook(workdir, extra_args=["--launcher-image", "registry.example/launcher:1"])
    api_client = control_plane.api_client()
    admission = client.AdmissionregistrationV1Api(api_client)
    admission.create_mutating_webhook_configuration(chart_webhook_configuration(hook.url, hook.ca_file.read_bytes()))
    time.sleep(1.5)  # the API server picks configurations up through an informer
    state = {"hook": hook, "workdir": workdir, "api": api_client}
    yield state
    admission.delete_mutating_webhook_configuration(CONFIG_NAME)
    state["hook"].stop()


def example_objects() -> list[dict]:
    return [d for d in yaml.safe_load_all((ROOT / "examples/pytorch/ddp.yaml").read_text()) if d]


# The example's own variables (EPOCHS, and the warnings it silences), as its StatefulSet's container lists them.
USER_ENV = [e["name"] for o in example_objects() if o["kind"] == "StatefulSet"
            for e in o["spec"]["template"]["spec"]["containers"][0]["env"]]




def env_of(pod) -> dict[str, str]:
    return {e.name: e.value for e in pod.spec.containers[0].env or []}


def create_example(api_client, namespace: str) -> None:
    core, apps = client.CoreV1Api(api_client), client.AppsV1Api(api_client)
    for obj in example_objects():
        if obj["kind"] == "Service":
            core.create_namespaced_service(namespace, obj)
        elif obj["kind"] == "ConfigMap":
            core.create_namespaced_config_map(namespace, obj)
        else:
            apps.create_namespaced_stateful_set(namespace, obj)


def gang_pods(api_client, namespace: str, count: int):
    core = client.CoreV1Api(api_client)

    def listed():
        pods = core.list_namespaced_pod(namespace, label_selector="trainhook.dev/job-name=ddp").items
        return sorted(pods, key=lambda p: p.metadata.name) if len(pods) >= count else None
    return wait_for(f"{count} gang pods", listed, timeout=60)


def test_the_controllers_pods_carry_the_contracts_wiring(wired_cluster, k8s_namespace):
    api_client, ns = wired_cluster["api"], k8s_namespace
    create_example(api_client, ns)
    service = client.CoreV1Api(api_client).read_namespaced_service("ddp", ns)
    assert service.spec.cluster_ip == "None" and service.spec.publish_not_ready_addresses is True
    sts = client.AppsV1Api(api_client).read_namespaced_stateful_set("ddp", ns)
    assert sts.spec.pod_management_policy == "Parallel"
    assert sts.spec.template.metadata.annotations["trainhook.dev/replicas"] == "worker=4"
    pods = gang_pods(api_client, ns, 4)
    assert [p.metadata.name for p in pods] == ["ddp-0", "ddp-1", "ddp-2", "ddp-3"]
    for rank, pod in enumerate(pods):
        env = env_of(pod)
        assert (env["RANK"], env["WORLD_SIZE"], env["MASTER_ADDR"], env["PET_NNODES"]) == (
            str(rank), "4", "ddp-0.ddp", "4")
        assert env["TRAINHOOK_ADDRESS"] == f"ddp-{rank}.ddp" and env["TRAINHOOK_NAMESPACE"] == ns
        names = [e.name for e in pod.spec.containers[0].env]
        assert names[-len(USER_ENV):] == USER_ENV, "the user's env comes last, in its order"
        init = pod.spec.init_containers[0]
        assert (init.name, init.image, init.command) == ("trainhook-gang-wait", "registry.example/launcher:1",
                                                          ["trainhook-launch", "wait", "--install", "/trainhook"])
        assert pod.spec.containers[0].command[:3] == ["/trainhook/bin/trainhook-launch", "run", "--"]
        assert pod.spec.hostname == f"ddp-{rank}" and pod.spec.subdomain == "ddp"


def test_gpu_pods_get_the_gpu_toleration(wired_cluster, k8s_namespace):
    api_client, ns = wired_cluster["api"], k8s_namespace
    sts = [o for o in example_objects() if o["kind"] == "StatefulSet"][0]
    sts["metadata"]["name"] = sts["spec"]["serviceName"] = "gpu"
    sts["spec"]["replicas"] = 1
    sts["spec"]["template"]["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "2"}}
    sts["spec"]["template"]["spec"]["volumes"] = []
    sts["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] = []
    client.AppsV1Api(api_client).create_namespaced_stateful_set(ns, sts)
    core = client.CoreV1Api(api_client)
    pod = wait_for("the GPU pod", lambda: next(iter(core.list_namespaced_pod(
        ns, label_selector="trainhook.dev/job-name=gpu").items), None), timeout=60)
    tolerations = [(t.key, t.operator, t.effect) for t in pod.spec.tolerations]
    assert ("nvidia.com/gpu", "Exists", "NoSchedule") in tolerations
    assert env_of(pod)["PET_NPROC_PER_NODE"] == "2"


def test_a_refused_workload_fails_with_the_webhooks_message(wired_cluster, k8s_namespace):
    sts = [o for o in example_objects() if o["kind"] == "StatefulSet"][0]
    sts["metadata"]["labels"]["trainhook.dev/role"] = "boss"
    with pytest.raises(ApiException) as caught:
        client.AppsV1Api(wired_cluster["api"]).create_namespaced_stateful_set(k8s_namespace, sts)
    assert caught.value.status == 403
    assert "trainhook.dev/role='boss': not a pytorch role; use one of master, worker" in caught.value.body


def test_a_labeled_deployment_is_refused_by_the_api_server_naming_the_kind_and_an_unlabeled_one_created(
        wired_cluster, k8s_namespace):
    """The chart registers Deployments (issue 34): labeled for training, one is refused with the webhook's reason
    instead of being admitted into pods that can never form a gang; any other Deployment never reaches trainhook."""
    apps = client.AppsV1Api(wired_cluster["api"])

    def deployment(name: str, labels: dict) -> dict:
        return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": labels},
                "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                         "template": {"metadata": {"labels": {"app": name}},
                                      "spec": {"containers": [{"name": "c", "image": "x"}]}}}}
    with pytest.raises(ApiException) as caught:
        apps.create_namespaced_deployment(k8s_namespace, deployment("trainer", {"trainhook.dev/framework": "pytorch"}))
    assert caught.value.status == 403
    assert "Deployment is an unsupported kind" in caught.value.body
    assert "the supported kinds are StatefulSet, Job (Indexed), Pod, Service" in caught.value.body
    assert apps.create_namespaced_deployment(k8s_namespace, deployment("web", {"app": "web"})).metadata.name == "web"


def test_scaling_a_statefulset_restamps_its_pods_shape(wired_cluster, k8s_namespace):
    api_client, ns = wired_cluster["api"], k8s_namespace
    create_example(api_client, ns)
    gang_pods(api_client, ns, 4)
    apps = client.AppsV1Api(api_client)
    apps.patch_namespaced_stateful_set("ddp", ns, {"spec": {"replicas": 6}})
    assert apps.read_namespaced_stateful_set("ddp", ns).spec.template.metadata.annotations[
        "trainhook.dev/replicas"] == "worker=6"
    pods = gang_pods(api_client, ns, 6)
    assert {p.metadata.name: env_of(p)["WORLD_SIZE"] for p in pods}["ddp-5"] == "6"
    assert env_of(pods[5])["RANK"] == "5"


def test_webhook_down_blocks_labeled_pods_only_and_the_controller_recovers(wired_cluster, k8s_namespace):
    api_client, ns = wired_cluster["api"], k8s_namespace
    core = client.CoreV1Api(api_client)
    create_example(api_client, ns)
    gang_pods(api_client, ns, 4)
    hook = wired_cluster["hook"]
    port = int(hook.url.rsplit(":", 1)[1])
    hook.stop()
    try:
        core.delete_namespaced_pod("ddp-1", ns, grace_period_seconds=0)
        plain = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain"},
                 "spec": {"containers": [{"name": "c", "image": "busybox", "command": ["true"]}]}}
        core.create_namespaced_pod(ns, plain)  # unlabeled: the objectSelector keeps the webhook out of its way

        def failed_create_seen():
            events = core.list_namespaced_event(ns).items
            return [e for e in events if e.reason == "FailedCreate" and "ddp-1" in (e.message or "")]
        events = wait_for("a FailedCreate event for ddp-1", failed_create_seen, timeout=30)
        assert "trainhook" in events[0].message or "webhook" in events[0].message
        names = {p.metadata.name for p in core.list_namespaced_pod(ns).items}
        assert "ddp-1" not in names and "plain" in names
    finally:
        wired_cluster["hook"] = start_webhook(wired_cluster["workdir"], port=port,
                                              extra_args=["--launcher-image", "registry.example/launcher:1"])
    pod = wait_for("ddp-1 recreated", lambda: next(
        (p for p in core.list_namespaced_pod(ns).items if p.metadata.name == "ddp-1"), None), timeout=90)
    assert env_of(pod)["RANK"] == "1"


def test_indexed_jobs_are_not_available_on_1_20_and_their_pods_are_refused_clearly(wired_cluster,
                                                                                    k8s_namespace):
    api_client, ns = wired_cluster["api"], k8s_namespace
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": "ij", "labels": {"trainhook.dev/framework": "pytorch"}},
           "spec": {"completions": 2, "parallelism": 2, "completionMode": "Indexed",
                    "template": {"metadata": {"labels": {"trainhook.dev/framework": "pytorch"}},
                                 "spec": {"restartPolicy": "Never", "containers": [
                                     {"name": "t", "image": "busybox", "command": ["true"]}]}}}}
    created = client.BatchV1Api(api_client).create_namespaced_job(ns, job)
    assert created.spec.template.metadata.annotations["trainhook.dev/replicas"] == "worker=2"
    core = client.CoreV1Api(api_client)

    def refusal():
        return [e.message for e in core.list_namespaced_event(ns).items
                if e.reason == "FailedCreate" and "completion index" in (e.message or "")]
    messages = wait_for("the Job pods' refusal", refusal, timeout=30)
    assert "set spec.completionMode: Indexed on the Job" in messages[0]


def test_a_priority_class_annotation_reaches_the_api_servers_priority_plugin(wired_cluster, k8s_namespace):
    api_client, ns = wired_cluster["api"], k8s_namespace
    scheduling = client.SchedulingV1Api(api_client)
    name = f"train-high-{ns}"
    scheduling.create_priority_class({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                                      "metadata": {"name": name}, "value": 1000})
    try:
        sts = [o for o in example_objects() if o["kind"] == "StatefulSet"][0]
        sts["metadata"]["annotations"] = {"trainhook.dev/priority-class": name}
        sts["spec"]["replicas"] = 2
        client.AppsV1Api(api_client).create_namespaced_stateful_set(ns, sts)
        pods = gang_pods(api_client, ns, 2)
        assert [(p.spec.priority_class_name, p.spec.priority) for p in pods] == [(name, 1000)] * 2
        bare = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "solo", "labels": {"trainhook.dev/framework": "pytorch",
                                                        "trainhook.dev/job-name": "solo", "trainhook.dev/index": "0"},
                             "annotations": {"trainhook.dev/replicas": "worker=1",
                                             "trainhook.dev/priority-class": name}},
                "spec": {"containers": [{"name": "t", "image": "busybox", "command": ["true"]}]}}
        created = client.CoreV1Api(api_client).create_namespaced_pod(ns, bare)
        assert (created.spec.priority_class_name, created.spec.priority) == (name, 1000)
    finally:
        scheduling.delete_priority_class(name)


@pytest.mark.parametrize("resources, qos", [
    ({"limits": {"cpu": "2", "memory": "2Gi"}}, "Guaranteed"),  # requests default to the limits
    ({"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "2Gi"}}, "Burstable"),  # the example's
])
def test_the_gang_wait_keeps_the_pods_qos_class_as_the_api_server_computes_it(wired_cluster, k8s_namespace,
                                                                               resources, qos):
    """The API server classes each pod at its creation, after the webhook's patch: the gang-wait init container
    (requests equal to its limits in a Guaranteed pod) leaves the class the user's containers give it."""
    api_client, ns = wired_cluster["api"], k8s_namespace
    sts = [o for o in example_objects() if o["kind"] == "StatefulSet"][0]
    sts["spec"]["replicas"] = 2
    sts["spec"]["template"]["spec"]["containers"][0]["resources"] = resources
    client.AppsV1Api(api_client).create_namespaced_stateful_set(ns, sts)
    pods = gang_pods(api_client, ns, 2)
    assert [p.spec.init_containers[0].name for p in pods] == ["trainhook-gang-wait"] * 2
    assert [p.status.qos_class for p in pods] == [qos] * 2


def test_a_quota_on_cpu_limits_charges_a_gang_pod_no_more_than_its_own_containers(wired_cluster, k8s_namespace):
    """The ResourceQuota admission charges a pod the larger of its containers' sum and any init container's
    limit, after the webhook's patch: the gang-wait container's CPU limit stays within the containers' sum, so a
    quota sized for the user's pods still admits them."""
    api_client, ns = wired_cluster["api"], k8s_namespace
    core = client.CoreV1Api(api_client)
    core.create_namespaced_resource_quota(ns, {"metadata": {"name": "cpu-limits"},
                                               "spec": {"hard": {"limits.cpu": "600m", "limits.memory": "4Gi"}}})
    wait_for("the quota's status", lambda: core.read_namespaced_resource_quota("cpu-limits", ns).status.hard,
             timeout=30)
    sts = [o for o in example_objects() if o["kind"] == "StatefulSet"][0]
    sts["spec"]["replicas"] = 1
    sts["spec"]["template"]["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "500m", "memory": "1Gi"}}
    client.AppsV1Api(api_client).create_namespaced_stateful_set(ns, sts)
    [pod] = gang_pods(api_client, ns, 1)
    assert pod.spec.init_containers[0].resources.limits["cpu"] == "500m"
    used = wait_for("the quota's usage", lambda: core.read_namespaced_resource_quota("cpu-limits", ns).status.used)
    assert used["limits.cpu"] == "500m", used
