"""The Helm chart, rendered and linted by a real Helm v4 and checked against Kubernetes' own API schemas.

Every value set is rendered once per session; each test reads the objects it is about. The release goes into
`ml-platform` (not `trainhook`), so a test can tell the release's namespace apart from every other name.
"""

from __future__ import annotations

import base64
import copy
import functools
import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from chart_render import CHART, GET_HELM, HelmError, find, find_all, helm_binary, render_chart, run_helm
from chart_sets import (CA_PEM, DATA, FULL_VALUES_FILE, NAMESPACE, VALUE_SETS, find_secret_volume, merged, value_sets,
                        webhook_container)
from trainhook.gang import keys

CERT_MANAGER_SCHEMA = json.loads((DATA / "cert-manager-v1.schema.json").read_text())
CERT_MANAGER_KINDS = {"Certificate", "Issuer"}


def kubernetes_versions() -> list[str]:
    """Every minor version kubernetes-validate has schemas for, from 1.25 on (1.20, which it has no schemas for,
    is tested on a real node: tests/e2e)."""
    known = {tuple(int(part) for part in version.split(".")[:2])
             for version in kubernetes_validate.utils.all_versions()}  # listed twice: plain and strict schemas
    return [f"{major}.{minor}" for major, minor in sorted(known) if (major, minor) >= (1, 25)]


# Below this version the chart renders differently (templates/pdb.yaml): manifests for older versions are rendered
# for them; from it on, the default render (Helm's own, newer, Kubernetes version) is what each version gets.
RENDERS_DIFFER_BEFORE = (1, 27)


@functools.cache
def rendered_for(version: str) -> dict[str, list[dict]]:
    return {name: render_chart(values, NAMESPACE, kube_version=f"{version}.0") for name, values in VALUE_SETS.items()}


# --- Helm itself -------------------------------------------------------------------------------------------------

def test_helm_is_the_pinned_v4_and_fetching_it_again_changes_nothing():
    path = Path(helm_binary())
    assert run_helm("version", "--template", "{{ .Version }}").startswith("v4.")
    before = path.stat().st_mtime_ns
    again = subprocess.run([sys.executable, str(GET_HELM)], capture_output=True, text=True, check=True)
    assert again.stdout.strip() == str(path)
    assert path.stat().st_mtime_ns == before


@pytest.mark.parametrize("extra", [
    pytest.param([], id="default-values"),
    pytest.param(["--values", str(FULL_VALUES_FILE)], id="full-values"),
    pytest.param(["--values", str(FULL_VALUES_FILE), "--set", "certificates.mode=cert-manager"], id="cert-manager"),
    pytest.param(["--set", "certificates.mode=secret,certificates.secretName=user-tls",
                  "--set-string", f"certificates.caBundle={base64.b64encode(CA_PEM.encode()).decode()}"],
                 id="secret"),
])
def test_helm_lint_strict_passes(extra):
    out = run_helm("lint", "--strict", str(CHART), "--namespace", NAMESPACE, *extra)
    assert "1 chart(s) linted, 0 chart(s) failed" in out
    assert "[WARNING]" not in out and "[ERROR]" not in out


# --- Every manifest is valid Kubernetes --------------------------------------------------------------------------

def test_the_validated_versions_run_from_1_25_to_the_newest_kubernetes_validate_knows():
    versions = kubernetes_versions()
    assert versions[0] == "1.25"
    assert versions[-1] == ".".join(kubernetes_validate.latest_version().split(".")[:2])
    minors = [int(v.split(".")[1]) for v in versions]
    assert minors == list(range(25, minors[-1] + 1)), versions


@pytest.mark.parametrize("version", kubernetes_versions())
def test_every_rendered_manifest_is_valid_under_strict_schemas(rendered, version, monkeypatch):
    # kubernetes-validate parses the version's schema files (~2 MB) again for every object: keep them for this test.
    monkeypatch.setattr(kubernetes_validate.utils, "schema_contents",
                        functools.cache(kubernetes_validate.utils.schema_contents))
    checked: set[str] = set()
    older = tuple(int(part) for part in version.split(".")) < RENDERS_DIFFER_BEFORE
    for name, manifests in (rendered_for(version) if older else rendered).items():
        for manifest in manifests:
            if manifest["kind"] in CERT_MANAGER_KINDS:
                continue  # not Kubernetes' own: checked against cert-manager's schema below
            key = json.dumps(manifest, sort_keys=True)
            if key in checked:
                continue
            checked.add(key)
            where = f"{name}: {manifest['kind']}/{manifest['metadata']['name']}"
            try:
                used = kubernetes_validate.validate(manifest, f"{version}.0", strict=True)
            except kubernetes_validate.ValidationError as e:
                pytest.fail(f"{where} is invalid for Kubernetes {version}: {e.message} at {list(e.path)}")
            assert used == version, f"{where}: validated against {used}, not {version}"
    kinds = {json.loads(key)["kind"] for key in checked}
    assert kinds == {"Deployment", "Service", "ServiceAccount", "PodDisruptionBudget", "MutatingWebhookConfiguration",
                     "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding",
                     "NetworkPolicy",  # values-full's networkPolicy
                     "Job"}  # the uninstall check's pre-delete hook (tests/chart/test_chart_uninstall.py); no Secret: no key


@pytest.mark.parametrize("name", value_sets("cert-manager"))
def test_cert_manager_objects_match_cert_managers_schema(rendered, name):
    objects = [m for m in rendered[name] if m["kind"] in CERT_MANAGER_KINDS]
    assert objects
    for manifest in objects:
        schema = {**CERT_MANAGER_SCHEMA, "$ref": f"#/$defs/{manifest['kind']}"}
        jsonschema.Draft202012Validator(schema).validate(manifest)


def test_the_cert_manager_schema_catches_a_misspelled_field(rendered):
    certificate = copy.deepcopy(find(rendered["cert-manager"], "Certificate", "trainhook"))
    certificate["spec"]["dnsName"] = certificate["spec"].pop("dnsNames")
    with pytest.raises(jsonschema.ValidationError, match="dnsName"):
        jsonschema.Draft202012Validator({**CERT_MANAGER_SCHEMA, "$ref": "#/$defs/Certificate"}).validate(certificate)


def test_no_other_mode_renders_cert_manager_objects(rendered):
    for name in value_sets("self-managed") + value_sets("secret"):
        assert not [m for m in rendered[name] if m["apiVersion"].startswith("cert-manager.io/")], name


@pytest.mark.parametrize("version", ["1.19.16", "1.21.0", "1.24.17"])
def test_kubernetes_versions_nothing_tests_are_refused(version):
    with pytest.raises(HelmError, match="kubeVersion"):
        render_chart({}, NAMESPACE, kube_version=version)


@pytest.mark.parametrize("version", ["1.20.0", "1.20.15", "1.25.0", "1.37.0"])
def test_the_tested_kubernetes_versions_are_accepted(version):
    assert render_chart({}, NAMESPACE, kube_version=version)


def budget(extra: list[str]) -> dict:
    out = run_helm("template", "trainhook", str(CHART), "--namespace", NAMESPACE, "--show-only",
                   "templates/pdb.yaml", *extra)
    return yaml.safe_load(out)


@pytest.mark.parametrize("extra, api_version, eviction_policy", [
    # What `helm install` sees: the cluster's own list of kinds (1.20 serves policy/v1beta1 only).
    pytest.param(["--kube-version", "1.20.2", "--api-versions", "policy/v1beta1/PodDisruptionBudget"],
                 "policy/v1beta1", False, id="1.20-cluster"),
    pytest.param(["--kube-version", "1.29.0", "--api-versions", "policy/v1/PodDisruptionBudget"],
                 "policy/v1", True, id="1.29-cluster"),
    # Without a cluster (helm template): by version.
    pytest.param(["--kube-version", "1.20.2"], "policy/v1beta1", False, id="1.20-template"),
    pytest.param(["--kube-version", "1.25.0"], "policy/v1", False, id="1.25-template"),
    pytest.param([], "policy/v1", True, id="default-template"),
])
def test_the_disruption_budget_uses_the_api_the_cluster_serves(extra, api_version, eviction_policy):
    pdb = budget(extra)
    assert pdb["apiVersion"] == api_version
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"]
    # unhealthyPodEvictionPolicy exists (on by default) from 1.27; older API servers would refuse or drop it.
    assert ("unhealthyPodEvictionPolicy" in pdb["spec"]) == eviction_policy


# --- The webhook registration ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_both_webhooks_fail_closed_without_side_effects_and_only_for_opted_in_objects(rendered, name):
    values = merged(yaml.safe_load((CHART / "values.yaml").read_text()), VALUE_SETS[name])
    config = find(rendered[name], "MutatingWebhookConfiguration")
    hooks = {hook["name"]: hook for hook in config["webhooks"]}
    assert set(hooks) == {"workloads.trainhook.dev", "services.trainhook.dev", "scale.trainhook.dev"}
    for hook in hooks.values():
        # The scale check fails open: a Scale has no labels to select gangs by, so it sees every StatefulSet's
        # scale, and an unlabeled StatefulSet must never depend on trainhook being up (tests/chart/test_scale_chart.py).
        assert hook["failurePolicy"] == ("Ignore" if hook["name"] == "scale.trainhook.dev" else "Fail")
        assert hook["sideEffects"] == "None"
        assert hook["admissionReviewVersions"] == ["v1"]
        assert hook["reinvocationPolicy"] == "IfNeeded"
        # The scale check waits at most 3 s: it fails open, and every `kubectl scale` of any StatefulSet would
        # otherwise wait the whole timeout for a webhook that is down (docs/operate/helm.md).
        expected_timeout = (min(3, values["timeoutSeconds"]) if hook["name"] == "scale.trainhook.dev"
                            else values["timeoutSeconds"])
        assert hook["timeoutSeconds"] == expected_timeout
        (expression,) = hook["namespaceSelector"]["matchExpressions"]
        assert expression["key"] == "kubernetes.io/metadata.name" and expression["operator"] == "NotIn"
        assert set(expression["values"]) == {"kube-system", NAMESPACE, *values["excludeNamespaces"]}
    assert hooks["workloads.trainhook.dev"]["objectSelector"] == {
        "matchExpressions": [{"key": keys.FRAMEWORK, "operator": "Exists"}]}
    assert hooks["services.trainhook.dev"]["objectSelector"] == {
        "matchExpressions": [{"key": keys.JOB_NAME, "operator": "Exists"}]}


def test_the_rules_cover_what_is_mutated_pods_at_create_the_others_at_create_and_update(rendered):
    hooks = {h["name"]: h for h in find(rendered["self-managed"], "MutatingWebhookConfiguration")["webhooks"]}

    def covered(hook: dict) -> set[tuple[str, str, str, str]]:
        return {(group, version, resource, operation) for rule in hook["rules"] for group in rule["apiGroups"]
                for version in rule["apiVersions"] for resource in rule["resources"] for operation in rule["operations"]}

    # Pods are mutated at CREATE only: registered for UPDATE, failing closed, a pod's updates (a finalizer's
    # removal) would be refused while the webhook is down (tests/cluster/test_webhook_down_cluster.py).
    # Deployments, ReplicaSets, DaemonSets and ReplicationControllers are registered to be refused by name when
    # labeled (mutate.REFUSED_OPERATIONS): they make pods but never a gang.
    assert covered(hooks["workloads.trainhook.dev"]) == {("", "v1", "pods", "CREATE")} | {
        (group, "v1", resource, operation) for group, resource in [
            ("apps", "statefulsets"), ("batch", "jobs"), ("apps", "deployments"), ("apps", "replicasets"),
            ("apps", "daemonsets"), ("", "replicationcontrollers")]
        for operation in ("CREATE", "UPDATE")}
    assert covered(hooks["services.trainhook.dev"]) == {("", "v1", "services", op) for op in ("CREATE", "UPDATE")}
    for hook in hooks.values():
        assert all(rule["scope"] == "Namespaced" for rule in hook["rules"])


@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_the_webhooks_call_the_charts_service_which_reaches_the_servers_port(rendered, name):
    manifests = rendered[name]
    service = find(manifests, "Service")
    for hook in find(manifests, "MutatingWebhookConfiguration")["webhooks"]:
        assert hook["clientConfig"]["service"] == {"name": service["metadata"]["name"], "namespace": NAMESPACE,
                                                   "path": "/mutate", "port": 443}
    assert [p["name"] for p in service["spec"]["ports"]] == ["https", "notary"]  # the notary: test_chart_notary.py
    port = service["spec"]["ports"][0]
    assert port["port"] == 443
    container = webhook_container(manifests)
    (container_port,) = [p for p in container["ports"] if p["name"] == port["targetPort"]]
    assert container_port["containerPort"] == 9443
    assert "--port=9443" in container["args"]
    pod_labels = find(manifests, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()


@pytest.mark.parametrize("name", value_sets("self-managed"))
def test_self_managed_leaves_the_ca_bundle_to_the_webhook(rendered, name):
    config = find(rendered[name], "MutatingWebhookConfiguration")
    assert all("caBundle" not in hook["clientConfig"] for hook in config["webhooks"])
    assert "cert-manager.io/inject-ca-from" not in config["metadata"].get("annotations", {})
    # The webhook reads its Secret (which holds the CA key) through the API: it is never mounted
    # (tests/chart/test_chart_lifecycle.py checks every mode).
    assert not [v for v in find(rendered[name], "Deployment")["spec"]["template"]["spec"]["volumes"] if "secret" in v]


@pytest.mark.parametrize("name", value_sets("cert-manager"))
def test_cert_manager_injects_the_ca_of_the_certificate_the_webhook_serves(rendered, name):
    manifests = rendered[name]
    config = find(manifests, "MutatingWebhookConfiguration")
    namespace, certificate_name = config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].split("/")
    assert namespace == NAMESPACE
    certificate = find(manifests, "Certificate", certificate_name)
    assert all("caBundle" not in hook["clientConfig"] for hook in config["webhooks"])
    assert find_secret_volume(manifests)["secretName"] == certificate["spec"]["secretName"]
    assert "optional" not in find_secret_volume(manifests)
    service = find(manifests, "Service")["metadata"]["name"]
    assert f"{service}.{NAMESPACE}.svc" in certificate["spec"]["dnsNames"]
    assert "server auth" in certificate["spec"]["usages"]


def test_cert_manager_signs_with_the_releases_own_ca_by_default_and_with_a_given_issuer_otherwise(rendered):
    manifests = rendered["cert-manager"]
    serving = find(manifests, "Certificate", "trainhook")
    ca_issuer = find(manifests, "Issuer", serving["spec"]["issuerRef"]["name"])
    ca_certificate = find(manifests, "Certificate", "trainhook-ca")
    assert ca_certificate["spec"]["isCA"] is True
    assert ca_issuer["spec"]["ca"]["secretName"] == ca_certificate["spec"]["secretName"]
    self_signed = find(manifests, "Issuer", ca_certificate["spec"]["issuerRef"]["name"])
    assert self_signed["spec"] == {"selfSigned": {}}

    full = rendered["cert-manager-full"]
    assert find_all(full, "Issuer") == []
    (certificate,) = find_all(full, "Certificate")
    assert certificate["spec"]["issuerRef"] == {"name": "corporate-ca", "kind": "ClusterIssuer",
                                                "group": "cert-manager.io"}
    assert certificate["spec"]["duration"] == "2160h" and certificate["spec"]["renewBefore"] == "360h"
    assert f"ml-trainhook.{NAMESPACE}.svc.k8s.example.internal" in certificate["spec"]["dnsNames"]


@pytest.mark.parametrize("name", value_sets("secret"))
def test_secret_mode_serves_the_users_secret_and_trusts_the_users_ca(rendered, name):
    manifests = rendered[name]
    certificates = VALUE_SETS[name]["certificates"]
    for hook in find(manifests, "MutatingWebhookConfiguration")["webhooks"]:
        assert base64.b64decode(hook["clientConfig"]["caBundle"]).decode() == CA_PEM
    assert find_secret_volume(manifests)["secretName"] == certificates["secretName"]
    assert "optional" not in find_secret_volume(manifests)




# --- Labels ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_every_object_carries_the_standard_labels(rendered, name):
    for manifest in rendered[name]:
        labels = manifest["metadata"]["labels"]
        where = f"{manifest['kind']}/{manifest['metadata']['name']}"
        assert labels["app.kubernetes.io/instance"] == "trainhook", where
        assert labels["app.kubernetes.io/managed-by"] == "Helm", where
        assert labels["app.kubernetes.io/version"] == "0.1.0", where
        assert labels["app.kubernetes.io/name"] in ("trainhook", "hook"), where
        assert labels["app.kubernetes.io/component"] in ("webhook", "training", "launcher", "uninstall-check"), where
        assert labels["helm.sh/chart"] == "trainhook-0.1.0", where
        if manifest["kind"] not in ("MutatingWebhookConfiguration", "ClusterRole", "ClusterRoleBinding"):
            assert manifest["metadata"]["namespace"], where
