"""The chart's webhook registration on a real kube-apiserver (v1.20) with no webhook answering (issue 23 item 3).

The webhook fails closed (failurePolicy Fail) for what it registers, so it must register only what it mutates:
pods are mutated at CREATE only. Registered for UPDATE too, every update of a gang pod was refused while the
webhook was down, among them the removal of a finalizer (the Job controller's job-tracking finalizer, Kueue's),
so Jobs stalled and deleted pods stayed Terminating.
"""

from __future__ import annotations

import datetime as dt
import time

from kubernetes import client
from kubernetes.client.rest import ApiException

from helpers import wait_for
from test_control_plane_webhook import CONFIG_NAME, chart_webhook_configuration
from trainhook.certs.build import build_ca
from webhook_process import free_port

FINALIZER = "example.com/hold"


def gang_pod(name: str, finalizers: list[str] | None = None) -> dict:
    meta = {"name": name, "labels": {"trainhook.dev/framework": "pytorch", "trainhook.dev/job-name": "g"}}
    if finalizers:
        meta["finalizers"] = finalizers
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": [{"name": "trainer", "image": "example.com/train:1"}]}}


def test_with_the_webhook_down_a_gang_pods_finalizer_is_removed_and_the_pod_goes(control_plane,
                                                                              k8s_namespace):
    ns = k8s_namespace
    with control_plane.api_client() as api:  # admitted earlier, while the webhook was up (here: not yet registered)
        client.CoreV1Api(api).create_namespaced_pod(ns, gang_pod("g-0", [FINALIZER]))
    admission = client.AdmissionregistrationV1Api(control_plane.api_client())
    ca_pem = build_ca("unreachable-webhook-ca", dt.datetime.now(dt.timezone.utc)).cert_pem
    admission.create_mutating_webhook_configuration(
        chart_webhook_configuration(f"https://127.0.0.1:{free_port()}", ca_pem))
    try:
        with control_plane.api_client() as api:
            core = client.CoreV1Api(api)

            def refused_create() -> bool:  # the registration is in force once a new gang pod is refused
                try:
                    core.create_namespaced_pod(ns, gang_pod(f"probe-{time.monotonic_ns()}"))
                except ApiException as e:
                    return e.status == 500 and "workloads.trainhook.dev" in e.body
                return False
            wait_for("the chart's registration in force (a new gang pod refused)", refused_create, timeout=20)
            core.delete_namespaced_pod("g-0", ns)  # Terminating: its finalizer holds it
            assert core.read_namespaced_pod("g-0", ns).metadata.deletion_timestamp is not None
            # What the Job controller and Kueue do: an update of the gang pod, with the webhook down.
            core.patch_namespaced_pod("g-0", ns, {"metadata": {"labels": {"example.com/seen": "yes"}}})
            core.patch_namespaced_pod("g-0", ns, [{"op": "remove", "path": "/metadata/finalizers"}])

            def gone() -> bool:
                try:
                    core.read_namespaced_pod("g-0", ns)
                except ApiException as e:
                    return e.status == 404
                return False
            wait_for("the pod deleted once its finalizer is removed", gone, timeout=20)
    finally:
        admission.delete_mutating_webhook_configuration(CONFIG_NAME)


def test_the_chart_registers_exactly_the_operations_the_webhook_mutates():
    """The registration and webhook/admission/mutate.py cannot drift apart: a kind registered for an operation it is not
    mutated at would wait on the webhook (and fail with it) for nothing."""
    from chart_render import find, render_chart
    from trainhook.webhook.admission.mutate import MUTATED_OPERATIONS
    kinds = {"pods": "Pod", "statefulsets": "StatefulSet", "jobs": "Job", "services": "Service"}
    registered: dict[str, set[str]] = {}
    for hook in find(render_chart({}), "MutatingWebhookConfiguration")["webhooks"]:
        for rule in hook["rules"]:
            for resource in rule["resources"]:
                if resource in kinds:
                    registered.setdefault(kinds[resource], set()).update(rule["operations"])
    assert registered == {kind: set(operations) for kind, operations in MUTATED_OPERATIONS.items()}
