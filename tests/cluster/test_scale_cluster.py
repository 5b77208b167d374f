"""`kubectl scale` on a real kube-apiserver (v1.20, started by the tests) with the real webhook behind it over
HTTPS, registered through the chart's own MutatingWebhookConfiguration (its scale.trainhook.dev entry included),
and watching StatefulSets through the API server as it does in a cluster (--watch-statefulsets, KUBECONFIG).

The scale is what kubectl scale and an HPA send: a PATCH (or a PUT) of the statefulsets/scale subresource, whose
review carries a Scale without labels (issue 18).
"""

from __future__ import annotations

import copy
import json
import time

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from helpers import wait_for
from objects import statefulset
from test_control_plane_webhook import chart_webhook_configuration
from webhook_process import start_webhook

CONFIG_NAME = "trainhook-test"  # chart_webhook_configuration names it so; one module registers it at a time


@pytest.fixture(scope="module")
def scale_cluster(control_plane, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("scale-webhook")
    hook = start_webhook(workdir, extra_args=["--launcher-image", "registry.example/launcher:1",
                                              "--watch-statefulsets"], env=control_plane.env())
    wait_for("the webhook's first list of StatefulSets", lambda: "statefulsets listed" in hook.log_file.read_text())
    api_client = control_plane.api_client()
    admission = client.AdmissionregistrationV1Api(api_client)
    config = chart_webhook_configuration(hook.url, hook.ca_file.read_bytes())
    assert "scale.trainhook.dev" in {w["name"] for w in config["webhooks"]}
    admission.create_mutating_webhook_configuration(config)
    time.sleep(1.5)  # the API server picks configurations up through an informer
    state = {"hook": hook, "api": api_client}
    yield state
    admission.delete_mutating_webhook_configuration(CONFIG_NAME)
    state["hook"].stop()


def create(api_client, namespace: str, sts: dict, pods: int | None = None) -> None:
    """Create the StatefulSet and wait for its pods: by then the webhook's watch has long had it."""
    sts = copy.deepcopy(sts)
    sts["metadata"]["namespace"] = namespace
    client.AppsV1Api(api_client).create_namespaced_stateful_set(namespace, sts)
    count = sts["spec"]["replicas"] if pods is None else pods
    core = client.CoreV1Api(api_client)
    wait_for(f"{count} pods of {sts['metadata']['name']}", lambda: len(core.list_namespaced_pod(
        namespace, label_selector=f"app={sts['metadata']['name']}").items) == count, timeout=60)
    time.sleep(0.3)


def scale(api_client, namespace: str, name: str, replicas: int, how: str = "patch") -> None:
    apps = client.AppsV1Api(api_client)
    if how == "patch":  # kubectl scale, HPA
        apps.patch_namespaced_stateful_set_scale(name, namespace, {"spec": {"replicas": replicas}})
    else:
        current = apps.read_namespaced_stateful_set_scale(name, namespace)
        current.spec.replicas = replicas
        apps.replace_namespaced_stateful_set_scale(name, namespace, current)


def refused(api_client, namespace: str, name: str, replicas: int, how: str = "patch") -> str:
    with pytest.raises(ApiException) as error:
        scale(api_client, namespace, name, replicas, how)
    assert error.value.status == 403, error.value.body
    return json.loads(error.value.body)["message"]


def replicas_of(api_client, namespace: str, name: str) -> int:
    return client.AppsV1Api(api_client).read_namespaced_stateful_set(name, namespace).spec.replicas


@pytest.mark.parametrize("how", ["patch", "replace"])
def test_scaling_a_running_fixed_gang_is_refused_with_the_fix(scale_cluster, k8s_namespace, how):
    api, ns = scale_cluster["api"], k8s_namespace
    create(api, ns, statefulset("ddp", 3))
    body = refused(api, ns, "ddp", 4, how)
    assert body.startswith('admission webhook "scale.trainhook.dev" denied the request: ')
    assert (f"trainhook: StatefulSet {ns}/ddp is a 3-member pytorch gang (trainhook.dev/replicas='worker=3'); "
            "kubectl scale cannot change a running gang's size (spec.replicas 3 -> 4): change spec.replicas with "
            "kubectl apply (the gang restarts with the new shape) or make it elastic with trainhook.dev/elastic: "
            "min:max") in body
    assert replicas_of(api, ns, "ddp") == 3


def test_a_gang_scales_to_zero_and_back_to_its_size_but_no_other(scale_cluster, k8s_namespace):
    api, ns = scale_cluster["api"], k8s_namespace
    create(api, ns, statefulset("ddp", 3))
    scale(api, ns, "ddp", 0)  # the launcher's scale of a finished gang
    assert replicas_of(api, ns, "ddp") == 0
    assert "(spec.replicas 0 -> 5)" in refused(api, ns, "ddp", 5)
    scale(api, ns, "ddp", 3)  # rerunning the finished gang
    assert replicas_of(api, ns, "ddp") == 3


def test_an_elastic_gang_scales_within_its_range_without_rolling_its_pods(scale_cluster, k8s_namespace):
    api, ns = scale_cluster["api"], k8s_namespace
    create(api, ns, statefulset("el", 2, annotations={"trainhook.dev/elastic": "2:4"}))
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    before = apps.read_namespaced_stateful_set("el", ns)
    scale(api, ns, "el", 3)
    pods = wait_for("pod el-2", lambda: [p for p in core.list_namespaced_pod(ns, label_selector="app=el").items
                                        if p.metadata.name == "el-2"], timeout=60)
    env = {e.name: e.value for e in pods[0].spec.containers[0].env}
    assert (env["PET_NNODES"], env["PET_RDZV_ENDPOINT"], env["TRAINHOOK_REPLICAS"]) == ("2:4", "el-0.el:23456",
                                                                                       "worker=4")
    after = apps.read_namespaced_stateful_set("el", ns)
    # The template did not change: same generation of it, so the controller rolls nothing.
    assert after.spec.template == before.spec.template
    assert after.status.update_revision == before.status.update_revision
    body = refused(api, ns, "el", 5)
    assert "trainhook.dev/elastic='2:4'" in body and "would make it 5: scale within 2..4" in body
    assert "(spec.replicas" not in body
    scale(api, ns, "el", 2)
    assert replicas_of(api, ns, "el") == 2


def test_an_unlabeled_statefulsets_scale_is_untouched(scale_cluster, k8s_namespace):
    api, ns = scale_cluster["api"], k8s_namespace
    plain = statefulset("web", 1)
    for labels in (plain["metadata"]["labels"], plain["spec"]["template"]["metadata"]["labels"]):
        del labels["trainhook.dev/framework"]
    create(api, ns, plain)
    scale(api, ns, "web", 5)
    assert replicas_of(api, ns, "web") == 5


def test_the_charts_role_is_enough_for_the_watch_and_no_more(control_plane, k8s_namespace):
    """The chart's <fullname>-statefulsets ClusterRole and binding, created on the real API server for a
    ServiceAccount of the chart's: the webhook's cache lists and watches StatefulSets with that token alone."""
    import uuid
    from chart_render import find, render_chart
    from cluster_api import wait_for_service_account_token
    from trainhook.webhook.statefulset_cache import StatefulSetCache, start_background, wait_synced
    fullname = f"th-{uuid.uuid4().hex[:8]}"
    manifests = render_chart({"fullnameOverride": fullname}, k8s_namespace)
    with control_plane.api_client() as api:
        core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
        core.create_namespaced_service_account(k8s_namespace, find(manifests, "ServiceAccount", fullname))
        rbac.create_cluster_role(find(manifests, "ClusterRole", f"{fullname}-statefulsets"))
        rbac.create_cluster_role_binding(find(manifests, "ClusterRoleBinding", f"{fullname}-statefulsets"))
        try:
            token = wait_for_service_account_token(api, k8s_namespace,
                                                   find(manifests, "ServiceAccount", fullname)["metadata"]["name"])
            create(api, k8s_namespace, statefulset("ddp", 2))
            with control_plane.token_client(token) as as_webhook:
                cache = StatefulSetCache()
                thread, stop = start_background(cache, as_webhook)
                try:
                    assert wait_synced(cache, 30)
                    assert cache.get(k8s_namespace, "ddp")["spec"]["replicas"] == 2
                    scale(api, k8s_namespace, "ddp", 0)  # through the watch, not a new list
                    wait_for("the watch's MODIFIED event", lambda: cache.get(k8s_namespace, "ddp")["spec"][
                        "replicas"] == 0)
                finally:
                    stop.set()
                with pytest.raises(ApiException) as error:
                    client.CoreV1Api(as_webhook).list_namespaced_pod(k8s_namespace)
                assert error.value.status == 403
        finally:
            rbac.delete_cluster_role_binding(f"{fullname}-statefulsets")
            rbac.delete_cluster_role(f"{fullname}-statefulsets")


def test_with_the_webhook_down_every_scale_goes_through(scale_cluster, k8s_namespace):
    """failurePolicy Ignore: an unlabeled StatefulSet must never depend on trainhook being up (last in this
    module: it stops the webhook)."""
    api, ns = scale_cluster["api"], k8s_namespace
    plain = statefulset("web", 1)
    for labels in (plain["metadata"]["labels"], plain["spec"]["template"]["metadata"]["labels"]):
        del labels["trainhook.dev/framework"]
    create(api, ns, plain)
    scale_cluster["hook"].stop()
    scale(api, ns, "web", 2)
    assert replicas_of(api, ns, "web") == 2
