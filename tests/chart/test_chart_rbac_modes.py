"""The chart's two least-privilege modes (issue 31 item 2), rendered and linted by the real Helm and validated against
Kubernetes' own schemas: with the ValidatingAdmissionPolicy (an API server that serves it, Kubernetes 1.30+) and with
namespaced bindings (`rbac.gangNamespaces`, for clusters that do not). What each ServiceAccount may then do on a real
API server is tests/cluster/test_rbac_matrix_cluster.py; what the policy refuses, tests/chart/test_chart_admission_policy.py.
"""

from __future__ import annotations

import functools
import json

import kubernetes_validate
import pytest
import yaml

from chart_render import CHART, RELEASE, HelmError, find, find_all, render_chart, render_notes, run_helm

NAMESPACE = "ml-platform"
VAP_API = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"
MODES = {
    "policy (1.30+, served)": ({}, (VAP_API,), "1.30"),
    "namespaced (before 1.30)": ({"rbac": {"gangNamespaces": ["team-a", "team-b"], "admissionPolicy": "auto"}}, (),
                                 "1.25"),
    "namespaced with the policy": ({"rbac": {"gangNamespaces": ["team-a"], "admissionPolicy": "auto"}}, (VAP_API,),
                                   "1.30"),
}


def render(values: dict, api_versions: tuple[str, ...], kube_version: str) -> list[dict]:
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", f"{kube_version}.0"]
    for version in api_versions:
        args += ["--api-versions", version]
    for key, value in values.items():
        args += ["--set-json", f"{key}={json.dumps(value)}"]
    return [doc for doc in yaml.safe_load_all(run_helm(*args)) if doc]


@pytest.mark.parametrize("mode", list(MODES))
def test_each_mode_lints_strict(mode):
    values, _, kube_version = MODES[mode]
    args = [f"--set-json=rbac={json.dumps({'gangNamespaces': [], 'admissionPolicy': 'auto', **values.get('rbac', {})})}"]
    out = run_helm("lint", "--strict", str(CHART), "--namespace", NAMESPACE, "--kube-version", f"{kube_version}.0",
                   *args)
    assert "1 chart(s) linted, 0 chart(s) failed" in out and "[WARNING]" not in out


@pytest.mark.parametrize("mode", list(MODES))
def test_every_manifest_of_each_mode_is_valid_kubernetes(mode, monkeypatch):
    monkeypatch.setattr(kubernetes_validate.utils, "schema_contents",
                        functools.cache(kubernetes_validate.utils.schema_contents))
    values, api_versions, kube_version = MODES[mode]
    manifests = render(values, api_versions, kube_version)
    for manifest in manifests:
        try:
            kubernetes_validate.validate(manifest, f"{kube_version}.0", strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{mode}: {manifest['kind']}/{manifest['metadata']['name']}: {e.message} at {list(e.path)}")
    assert bool([m for m in manifests if m["kind"] == "ValidatingAdmissionPolicy"]) == bool(api_versions)


def test_namespaced_mode_binds_the_notary_in_the_listed_namespaces_only_and_sees_only_them():
    manifests = render_chart({"rbac": {"gangNamespaces": ["team-a", "team-b"], "admissionPolicy": "auto"}}, NAMESPACE)
    bindings = [b for b in find_all(manifests, "RoleBinding") if b["roleRef"]["name"] == "trainhook-notary"]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    assert all(b["roleRef"]["kind"] == "ClusterRole" for b in bindings)  # its rules, held in that namespace only
    assert not [b for b in find_all(manifests, "ClusterRoleBinding") if b["roleRef"]["name"] == "trainhook-notary"]
    # Only the cluster-scoped TokenReview (and the public key set) stays cluster-wide.
    assert find(manifests, "ClusterRoleBinding", "trainhook-tokenreviews")
    for webhook in find(manifests, "MutatingWebhookConfiguration")["webhooks"]:
        assert {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a", "team-b"]} in \
            webhook["namespaceSelector"]["matchExpressions"], webhook["name"]
    # The default: bound cluster-wide, every namespace seen but the excluded ones.
    default = render_chart({}, NAMESPACE)
    assert find(default, "ClusterRoleBinding", "trainhook-notary")
    for webhook in find(default, "MutatingWebhookConfiguration")["webhooks"]:
        assert [e["operator"] for e in webhook["namespaceSelector"]["matchExpressions"]] == ["NotIn"]


def test_the_notes_say_which_mode_is_in_force():
    assert "NOTE: no ValidatingAdmissionPolicy" in render_notes({}, NAMESPACE)
    assert "list where gangs run in rbac.gangNamespaces" in render_notes({}, NAMESPACE)
    notes = render_notes({"rbac": {"gangNamespaces": ["team-a"], "admissionPolicy": "auto"}}, NAMESPACE)
    assert "bound in team-a only (gangs run only there)" in notes and "pod templates included) in team-a" in notes
    forced = render_notes({"rbac": {"gangNamespaces": [], "admissionPolicy": True}}, NAMESPACE)
    assert 'The ValidatingAdmissionPolicy "trainhook-webhook-writes"' in forced and "NOTE: no" not in forced


@pytest.mark.parametrize("value", ["yes", 1, "Auto"])
def test_a_wrong_admission_policy_value_is_refused_naming_it(value):
    with pytest.raises(HelmError, match="admissionPolicy"):
        render_chart({"rbac": {"gangNamespaces": [], "admissionPolicy": value}}, NAMESPACE)
