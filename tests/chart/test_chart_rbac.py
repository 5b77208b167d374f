"""The chart's RBAC (no wildcard; each mode's webhook may touch only what it needs) and the values it refuses,
rendered by the real Helm v4 (conftest.py's `rendered`)."""

from __future__ import annotations

import pytest

from chart_render import HelmError, find, find_all, render_chart
from chart_sets import (CA_PEM, FULL, NAMESPACE, SECRET_MODE, VALUE_SETS, literal_env, merged, rules_of, value_sets,
                        webhook_container)

# --- RBAC --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_no_role_grants_a_wildcard(rendered, name):
    for role in find_all(rendered[name], "Role") + find_all(rendered[name], "ClusterRole"):
        for rule in role["rules"]:
            for field in ("verbs", "resources", "apiGroups", "resourceNames"):
                assert not any("*" in item for item in rule.get(field, [])), (role["metadata"]["name"], rule)
            # Only the API server's public OpenID discovery document and key set (the notary verifies tokens locally).
            if "nonResourceURLs" in rule:
                assert rule == {"nonResourceURLs": ["/.well-known/openid-configuration", "/openid/v1/jwks"],
                                "verbs": ["get"]}, (role["metadata"]["name"], rule)
            forbidden = {"escalate", "bind", "impersonate", "deletecollection", "delete"}
            if role["metadata"]["name"].endswith("-launcher") and rule.get("resources") == ["configmaps"]:
                forbidden.discard("delete")  # old versions of its own launcher ConfigMaps (tests/chart/test_chart_lifecycle)
            assert not forbidden & set(rule["verbs"]), (role["metadata"]["name"], rule)


@pytest.mark.parametrize("name", value_sets("self-managed"))
def test_self_managed_may_touch_only_its_own_secret_and_its_own_webhook_configuration(rendered, name):
    manifests = rendered[name]
    fullname = find(manifests, "Deployment")["metadata"]["name"]
    secret = literal_env(webhook_container(manifests))["TRAINHOOK_WEBHOOK_SECRET_NAME"]
    config = find(manifests, "MutatingWebhookConfiguration")["metadata"]["name"]
    assert rules_of(manifests, "Role", f"{fullname}-certs") == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},  # create cannot name its object
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [secret], "verbs": ["get", "update"]},
    ]
    assert rules_of(manifests, "ClusterRole", f"{fullname}-webhook-config") == [
        {"apiGroups": ["admissionregistration.k8s.io"], "resources": ["mutatingwebhookconfigurations"],
         "resourceNames": [config], "verbs": ["get", "patch"]}]
    account = find(manifests, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
    for binding_kind, role_kind, role_name in [("RoleBinding", "Role", f"{fullname}-certs"),
                                               ("ClusterRoleBinding", "ClusterRole", f"{fullname}-webhook-config")]:
        binding = find(manifests, binding_kind, role_name)
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role_name}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}]
    assert find(manifests, "Deployment")["spec"]["template"]["spec"]["automountServiceAccountToken"] is True


@pytest.mark.parametrize("name", value_sets("cert-manager") + value_sets("secret"))
def test_other_modes_give_the_webhook_api_access_for_the_launcher_configmaps_only(rendered, name):
    manifests = rendered[name]
    webhook_roles = [m for m in manifests if m["kind"] in ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")
                     and m["metadata"]["labels"]["app.kubernetes.io/component"] == "webhook"]
    fullname = find(manifests, "Deployment")["metadata"]["name"]
    # Besides the launcher ConfigMaps, the gang key's one Secret (templates/gang-key.yaml) and the scale check's
    # reading of StatefulSets (tests/chart/test_scale_chart.py).
    assert {(m["kind"], m["metadata"]["name"]) for m in webhook_roles} >= {
        ("Role", f"{fullname}-gang-key"), ("RoleBinding", f"{fullname}-gang-key"),
        ("ClusterRole", f"{fullname}-statefulsets"), ("ClusterRoleBinding", f"{fullname}-statefulsets")}
    assert not [m for m in webhook_roles if m["metadata"]["name"] == f"{fullname}-certs"]
    # The launcher ConfigMaps: a Role in each training namespace (never a ClusterRole on ConfigMaps, which would
    # reach kube-system's); the ClusterRole only owns them and lets the webhook read its own uid.
    launcher_roles = [r for r in find_all(manifests, "Role")
                      if r["metadata"]["labels"]["app.kubernetes.io/component"] == "launcher"]
    assert sorted(r["metadata"]["namespace"] for r in launcher_roles) == sorted(
        merged({"trainingNamespaces": ["default"]}, VALUE_SETS[name])["trainingNamespaces"])
    assert all(r["rules"][0] == {"apiGroups": [""], "resources": ["configmaps"],
                                 "verbs": ["create", "get", "list", "delete"]} for r in launcher_roles)
    assert rules_of(manifests, "ClusterRole", f"{fullname}-launcher") == [
        {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"],
         "resourceNames": [f"{fullname}-launcher"], "verbs": ["get"]}]
    assert not [rule for role in find_all(manifests, "ClusterRole") for rule in role["rules"]
                if "configmaps" in rule.get("resources", []) or "secrets" in rule.get("resources", [])]
    assert find(manifests, "Deployment")["spec"]["template"]["spec"]["automountServiceAccountToken"] is True
    # Without launcherConfigMap and scaleCheck: neither role; the token stays (the gang key is read through the API).
    off = render_chart({"launcherConfigMap": False, "scaleCheck": False, **SECRET_MODE},
                       NAMESPACE)
    names = {r["metadata"]["name"] for r in find_all(off, "ClusterRole") + find_all(off, "Role")}
    assert not {"trainhook-launcher", "trainhook-statefulsets"} & names and "trainhook-gang-key" in names
    env = {e["name"] for e in find(off, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert "TRAINHOOK_WEBHOOK_LAUNCHER_NAMESPACES" not in env


def test_the_webhook_keeps_the_launcher_configmap_in_the_training_namespaces(rendered):
    manifests = rendered["self-managed-full"]
    [container] = find(manifests, "Deployment")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TRAINHOOK_WEBHOOK_LAUNCHER_NAMESPACES"] == ",".join(FULL["trainingNamespaces"])
    account = find(manifests, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
    # A RoleBinding in each training namespace (which must exist at install), and the owner's ClusterRoleBinding.
    fullname = find(manifests, "Deployment")["metadata"]["name"]
    bindings = [b for b in find_all(manifests, "RoleBinding") if b["roleRef"]["name"] == f"{fullname}-launcher"]
    assert [b["metadata"]["namespace"] for b in bindings] == FULL["trainingNamespaces"]
    for binding in [*bindings, find(manifests, "ClusterRoleBinding", f"{fullname}-launcher")]:
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}]
    assert env["TRAINHOOK_WEBHOOK_LAUNCHER_OWNER"] == f"{fullname}-launcher"


# Training pods get no RBAC from the chart (issue 22): tests/chart/test_chart_notary.py checks that nothing is bound to
# them and what the notary, which records for them, may do.


# --- Values that must be refused ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("values", "message"), [
    pytest.param({"replicaCount": "two"}, "/replicaCount': got string, want integer", id="replicaCount-string"),
    pytest.param({"replicas": 2}, "additional properties 'replicas' not allowed", id="unknown-top-level-key"),
    pytest.param({"certificates": {"secretname": "x"}}, "additional properties 'secretname' not allowed",
                 id="misspelled-nested-key"),
    pytest.param({"certificates": {"mode": "vault"}}, "/certificates/mode", id="unknown-certificate-mode"),
    pytest.param({"timeoutSeconds": 31}, "/timeoutSeconds", id="timeout-over-30"),
    pytest.param({"tolerations": [{"key": "a", "operator": "Maybe"}]}, "/tolerations/0/operator",
                 id="bad-toleration"),
    pytest.param({"trainingServiceAccounts": [{"namespace": "team-a", "name": "trainer"}]},
                 "trainingServiceAccounts was removed: training pods need no Kubernetes API permission",
                 id="training-service-accounts-removed"),
    pytest.param({"certificates": {"mode": "secret", "caBundle": CA_PEM}},
                 "certificates.secretName is required with certificates.mode=secret", id="secret-without-name"),
    pytest.param({"certificates": {"mode": "secret", "secretName": "user-tls"}},
                 "certificates.caBundle is required with certificates.mode=secret", id="secret-without-ca"),
    pytest.param({"certificates": {"mode": "secret", "secretName": "user-tls", "caBundle": "bm90IGEgY2VydA=="}},
                 "neither a PEM certificate", id="secret-with-garbage-ca"),
    pytest.param({"serviceAccount": {"create": False}}, "serviceAccount.name is required", id="no-service-account"),
])
def test_invalid_values_fail_with_a_message_naming_the_value(values, message):
    with pytest.raises(HelmError) as failure:
        render_chart(values, NAMESPACE)
    assert message in failure.value.stderr


def test_the_gang_key_is_never_rendered_the_webhook_keeps_it_in_a_secret_it_names():
    """Helm renders no key (a `helm template` render would make a new one): tests/chart/test_chart_lifecycle.py."""
    objects = render_chart({})
    assert find_all(objects, "Secret") == []
    container = find(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["TRAINHOOK_WEBHOOK_GANG_KEY_SECRET"]["value"] == "trainhook-gang-key"
    assert "TRAINHOOK_WEBHOOK_GANG_KEY" not in env
