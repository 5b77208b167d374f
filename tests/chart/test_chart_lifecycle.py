"""The chart across install, GitOps renders, upgrade and uninstall (issue 23, items 4, 5, 9, 10), rendered by the
real Helm: what a render holds must not depend on when or where it was rendered, nothing may need a namespace other
than the release's to exist, and no pod may mount a CA key. The API-server side of each is in
tests/cluster/test_gang_key_cluster.py, tests/cluster/test_launcher_configmap_cluster.py and tests/cluster/test_certs_rebuild_cluster.py."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from chart_render import CHART, RELEASE, find, find_all, render_chart, run_helm

NAMESPACE = "ml-platform"
CA_PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----"  # the chart checks the PEM markers only
MODES = {"self-managed": {},
         "cert-manager": {"certificates": {"mode": "cert-manager"}},
         "secret": {"certificates": {"mode": "secret", "secretName": "user-tls", "caBundle": CA_PEM}}}


def template(values: dict | None = None) -> str:
    """`helm template` output as text: byte for byte what a GitOps tool applies."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "values.yaml"
        path.write_text(json.dumps(values or {}))
        return run_helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--values", str(path))


@pytest.mark.parametrize("mode", list(MODES))
def test_two_renders_are_identical_and_hold_no_key(mode):
    """Argo CD and Flux render with `helm template` on every sync: a key made at render time (randAlphaNum behind
    lookup, as before) changed on each one, and replicas started from different renders disagreed."""
    first, second = template(MODES[mode]), template(MODES[mode])
    assert first == second
    manifests = render_chart(MODES[mode], NAMESPACE)
    assert not [m for m in find_all(manifests, "Secret")]
    assert "gang-key:" not in first
    for path in (CHART / "templates").iterdir():
        text = path.read_text()
        assert "lookup" not in text and "randAlphaNum" not in text and "randBytes" not in text, path.name


@pytest.mark.parametrize("mode", list(MODES))
def test_the_webhook_reads_the_gang_key_from_one_named_secret_and_may_create_only_that(mode):
    manifests = render_chart(MODES[mode], NAMESPACE)
    [container] = find(manifests, "Deployment")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TRAINHOOK_WEBHOOK_GANG_KEY_SECRET"] == "trainhook-gang-key"
    assert "TRAINHOOK_WEBHOOK_GANG_KEY_CREATE" not in env
    assert find(manifests, "Role", "trainhook-gang-key")["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},  # create cannot be limited by name
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["trainhook-gang-key"], "verbs": ["get"]}]
    binding = find(manifests, "RoleBinding", "trainhook-gang-key")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "trainhook", "namespace": NAMESPACE}]
    # Every mode reads the key through the API, so every mode gets a token.
    assert find(manifests, "Deployment")["spec"]["template"]["spec"]["automountServiceAccountToken"] is True


def test_an_existing_secret_is_only_read():
    manifests = render_chart({"gangKey": {"existingSecret": "team-gang-key"}}, NAMESPACE)
    [container] = find(manifests, "Deployment")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TRAINHOOK_WEBHOOK_GANG_KEY_SECRET"] == "team-gang-key"
    assert env["TRAINHOOK_WEBHOOK_GANG_KEY_CREATE"] == "false"
    assert find(manifests, "Role", "trainhook-gang-key")["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["team-gang-key"], "verbs": ["get"]}]


@pytest.mark.parametrize("mode", list(MODES))
def test_no_pod_mounts_a_ca_key(mode):
    """Self-managed reads its Secret (CA key included) through the API and mounts nothing; mode `secret` projects
    only the serving pair of the user's Secret; cert-manager's serving Secret holds no CA key (the CA's own Secret,
    `<fullname>-ca`, is never mounted)."""
    manifests = render_chart(MODES[mode], NAMESPACE)
    spec = find(manifests, "Deployment")["spec"]["template"]["spec"]
    secrets = [v["secret"] for v in spec["volumes"] if "secret" in v]
    if mode == "self-managed":
        assert secrets == []
        assert not [m for m in spec["containers"][0]["volumeMounts"] if m["mountPath"] == "/tls"]
    elif mode == "secret":
        [secret] = secrets
        assert [item["key"] for item in secret["items"]] == ["tls.crt", "tls.key"]
    else:
        [secret] = secrets
        ca_secrets = {c["spec"]["secretName"] for c in find_all(manifests, "Certificate") if c["spec"].get("isCA")}
        assert secret["secretName"] not in ca_secrets and ca_secrets == {"trainhook-ca"}
    for volume in spec["volumes"]:
        for item in (volume.get("secret") or {}).get("items", []):
            assert item["key"] != "ca.key"


def test_configmap_rights_only_in_the_training_namespaces_and_never_cluster_wide():
    """Issue 31: a ClusterRole on ConfigMaps let the webhook's ServiceAccount create and delete ConfigMaps in every
    namespace, kube-system's included. Now a Role in each of trainingNamespaces (so each must exist at install, the
    trade-off docs/operate/helm.md states) and the owner ClusterRole, which may only read itself."""
    manifests = render_chart({"trainingNamespaces": ["team-a", "team-b"]}, NAMESPACE)
    [container] = find(manifests, "Deployment")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TRAINHOOK_WEBHOOK_LAUNCHER_NAMESPACES"] == "team-a,team-b"
    assert env["TRAINHOOK_WEBHOOK_LAUNCHER_OWNER"] == "trainhook-launcher"
    assert find(manifests, "ClusterRole", "trainhook-launcher")["rules"] == [
        {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"],
         "resourceNames": ["trainhook-launcher"], "verbs": ["get"]}]
    for namespace in ("team-a", "team-b"):
        role = next(r for r in find_all(manifests, "Role")
                    if r["metadata"]["name"] == "trainhook-launcher" and r["metadata"]["namespace"] == namespace)
        assert role["rules"] == [
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "get", "list", "delete"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]
        binding = next(b for b in find_all(manifests, "RoleBinding")
                       if b["metadata"]["name"] == "trainhook-launcher" and b["metadata"]["namespace"] == namespace)
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "trainhook", "namespace": NAMESPACE}]
    configmap_rules = [(role["kind"], role["metadata"].get("namespace")) for role in
                       find_all(manifests, "ClusterRole") + find_all(manifests, "Role")
                       for rule in role["rules"] if "configmaps" in rule.get("resources", [])]
    assert sorted(configmap_rules) == [("Role", "team-a"), ("Role", "team-b")]
    # No update anywhere on ConfigMaps: the launcher ConfigMaps are immutable.
    for role in find_all(manifests, "ClusterRole") + find_all(manifests, "Role"):
        for rule in role["rules"]:
            if "configmaps" in rule.get("resources", []):
                assert not {"update", "patch"} & set(rule["verbs"]), role["metadata"]["name"]


def test_without_launcher_configmaps_no_configmap_permission_at_all():
    manifests = render_chart({"launcherConfigMap": False}, NAMESPACE)
    for role in find_all(manifests, "ClusterRole") + find_all(manifests, "Role"):
        for rule in role["rules"]:
            assert "configmaps" not in rule.get("resources", []), role["metadata"]["name"]
