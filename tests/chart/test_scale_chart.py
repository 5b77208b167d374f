"""The chart's scale check (value scaleCheck): the statefulsets/scale webhook entry, the read-only StatefulSet
role, and the server setting that turns the watch on, rendered by the real Helm (tests/support/chart_render.py)."""

from __future__ import annotations

import datetime as dt
import os

import pytest

from chart_render import find, find_all, render_chart
from trainhook.certs.build import build_ca
from trainhook.webhook import server

NAMESPACE = "ml-platform"
CA_PEM = build_ca("trainhook-test-ca", dt.datetime.now(dt.timezone.utc)).cert_pem.decode()
SECRET = {"certificates": {"mode": "secret", "secretName": "user-tls", "caBundle": CA_PEM}}


@pytest.fixture(scope="module")
def default() -> list[dict]:
    return render_chart({}, NAMESPACE)


@pytest.fixture(scope="module")
def off() -> list[dict]:
    return render_chart({"scaleCheck": False}, NAMESPACE)


def hooks_of(manifests: list[dict]) -> dict[str, dict]:
    return {h["name"]: h for h in find(manifests, "MutatingWebhookConfiguration")["webhooks"]}


def test_the_scale_entry_sees_every_statefulsets_scale_update_and_fails_open(default):
    hooks = hooks_of(default)
    scale = hooks["scale.trainhook.dev"]
    assert scale["rules"] == [{"apiGroups": ["apps"], "apiVersions": ["v1"], "resources": ["statefulsets/scale"],
                               "operations": ["UPDATE"], "scope": "Namespaced"}]
    # A Scale's metadata has no labels: an objectSelector would never match it.
    assert "objectSelector" not in scale
    assert scale["failurePolicy"] == "Ignore"
    # The same namespaces, service and path as the other entries.
    workloads = hooks["workloads.trainhook.dev"]
    for key in ("namespaceSelector", "clientConfig", "sideEffects", "admissionReviewVersions", "matchPolicy"):
        assert scale[key] == workloads[key], key
    # Every scale in the cluster passes here: it waits a few seconds at most, not the 10 s of the others.
    assert (scale["timeoutSeconds"], workloads["timeoutSeconds"]) == (3, 10)


def test_the_scale_entry_never_waits_longer_than_the_others():
    assert hooks_of(render_chart({"timeoutSeconds": 2}, NAMESPACE))["scale.trainhook.dev"]["timeoutSeconds"] == 2


def test_the_webhook_may_only_read_statefulsets_for_it(default):
    fullname = find(default, "Deployment")["metadata"]["name"]
    role = find(default, "ClusterRole", f"{fullname}-statefulsets")
    assert role["rules"] == [{"apiGroups": ["apps"], "resources": ["statefulsets"], "verbs": ["get", "list", "watch"]}]
    binding = find(default, "ClusterRoleBinding", f"{fullname}-statefulsets")
    account = find(default, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": f"{fullname}-statefulsets"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}]


def test_the_server_watches_statefulsets_exactly_when_the_chart_registers_the_scale_entry(default, off,
                                                                                          monkeypatch):
    for manifests, expected in ((default, True), (off, False)):
        container = find(manifests, "Deployment")["spec"]["template"]["spec"]["containers"][0]
        for variable in [v for v in os.environ if v.startswith("TRAINHOOK_WEBHOOK_")]:
            monkeypatch.delenv(variable)
        for item in container["env"]:
            if "value" in item:
                monkeypatch.setenv(item["name"], item["value"])
        assert server.parse_args(container["args"]).watch_statefulsets is expected
        assert ("scale.trainhook.dev" in hooks_of(manifests)) is expected


def test_scale_check_off_leaves_no_trace(off):
    assert [r for r in find_all(off, "ClusterRole") if r["metadata"]["name"].endswith("-statefulsets")] == []
    assert [b for b in find_all(off, "ClusterRoleBinding") if b["metadata"]["name"].endswith("-statefulsets")] == []


def test_the_scale_check_alone_is_a_reason_for_the_token():
    manifests = render_chart({"launcherConfigMap": False, **SECRET}, NAMESPACE)
    assert find(manifests, "Deployment")["spec"]["template"]["spec"]["automountServiceAccountToken"] is True
