"""The Helm chart, rendered and linted by a real Helm v4 and checked against Kubernetes' own API schemas.

Every value set is rendered once per session; each test reads the objects it is about. The release goes into
`ml-platform` (not `trainhook`), so a test can tell the release's namespace apart from every other name.
"""

from __future__ import annotations

import base64
import copy
import datetime as dt
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from chart_render import CHART, GET_HELM, HelmError, find, find_all, helm_binary, render_chart, render_notes, run_helm
from trainhook.gang import keys
from trainhook.certs.build import build_ca
from trainhook.webhook import server
from trainhook.webhook.settings import DEFAULT_LAUNCHER_IMAGE

DATA = Path(__file__).parent / "data"
FULL_VALUES_FILE = DATA / "values-full.yaml"
FULL = yaml.safe_load(FULL_VALUES_FILE.read_text())
CERT_MANAGER_SCHEMA = json.loads((DATA / "cert-manager-v1.schema.json").read_text())
NAMESPACE = "ml-platform"
CA_PEM = build_ca("trainhook-test-ca", dt.datetime.now(dt.timezone.utc)).cert_pem.decode()
CERT_MANAGER_KINDS = {"Certificate", "Issuer"}


def merged(base: dict, override: dict) -> dict:
    """`override` deep-merged over `base`, as Helm merges values files."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


SECRET_MODE = {"certificates": {"mode": "secret", "secretName": "user-tls", "caBundle": CA_PEM}}
VALUE_SETS: dict[str, dict] = {
    "self-managed": {},
    "self-managed-full": FULL,
    "cert-manager": {"certificates": {"mode": "cert-manager"}},
    "cert-manager-full": merged(FULL, {"certificates": {"mode": "cert-manager", "certManager": {
        "issuerRef": {"name": "corporate-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}}}}),
    "secret": SECRET_MODE,
    # The caBundle as base64 of the PEM this time, and a Secret name of the user's.
    "secret-full": merged(FULL, {"certificates": {"mode": "secret", "secretName": "corp-issued-tls",
                                                  "caBundle": base64.b64encode(CA_PEM.encode()).decode()}}),
    "single-replica": {"replicaCount": 1},
}
MODE_OF = {name: merged({"certificates": {"mode": "self-managed"}}, values)["certificates"]["mode"]
           for name, values in VALUE_SETS.items()}


def value_sets(mode: str | None = None) -> list[str]:
    return [name for name in VALUE_SETS if mode is None or MODE_OF[name] == mode]


@pytest.fixture(scope="session")
def rendered() -> dict[str, list[dict]]:
    return {name: render_chart(values, NAMESPACE) for name, values in VALUE_SETS.items()}


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


def webhook_container(manifests: list[dict]) -> dict:
    deployment = find(manifests, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def literal_env(container: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


def rules_of(manifests: list[dict], kind: str, name: str) -> list[dict]:
    return find(manifests, kind, name)["rules"]


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


def find_secret_volume(manifests: list[dict]) -> dict:
    deployment = find(manifests, "Deployment")
    (mount,) = [m for m in webhook_container(manifests)["volumeMounts"] if m["mountPath"] == "/tls"]
    assert mount["readOnly"] is True and "subPath" not in mount  # subPath mounts never see a rotated Secret
    (volume,) = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]]
    return volume["secret"]


# --- The webhook's Deployment ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_the_webhook_pod_is_hardened(rendered, name):
    pod = find(rendered[name], "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    context = webhook_container(rendered[name])["securityContext"]
    assert context["runAsNonRoot"] is True
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["privileged"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "hostNetwork" not in pod and "hostPID" not in pod


def test_the_user_ids_are_values_and_can_be_left_to_the_platform():
    pod = find(render_chart({"podSecurityContext": {"runAsUser": None, "runAsGroup": None, "fsGroup": None}},
                            NAMESPACE), "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}


@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_the_webhook_is_probed_over_https_and_has_resources(rendered, name):
    container = webhook_container(rendered[name])
    for probe, path in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz"), ("startupProbe", "/healthz")]:
        assert container[probe]["httpGet"] == {"path": path, "port": "https", "scheme": "HTTPS"}, probe
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]


def test_default_deployment_runs_two_spread_replicas_behind_a_disruption_budget(rendered):
    manifests = rendered["self-managed"]
    deployment = find(manifests, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    (term,) = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"].items() <= pod_labels.items()
    budget = find(manifests, "PodDisruptionBudget")
    assert budget["spec"]["minAvailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


def test_a_single_replica_gets_no_budget_that_would_block_drains(rendered):
    assert find(rendered["single-replica"], "Deployment")["spec"]["replicas"] == 1
    assert find_all(rendered["single-replica"], "PodDisruptionBudget") == []
    assert "WARNING: replicaCount is 1" in render_notes({"replicaCount": 1}, NAMESPACE)


def test_non_default_values_reach_the_deployment(rendered):
    manifests = rendered["self-managed-full"]
    deployment = find(manifests, "Deployment")
    pod = deployment["spec"]["template"]
    container = webhook_container(manifests)
    assert deployment["metadata"]["name"] == "ml-trainhook"
    assert deployment["spec"]["replicas"] == 3
    assert find(manifests, "PodDisruptionBudget")["spec"]["minAvailable"] == 2
    assert container["image"] == "registry.example.com/ml/trainhook-webhook:0.1.0-rc1"
    assert container["imagePullPolicy"] == "Always"
    assert container["resources"] == FULL["resources"]
    assert "--log-level=DEBUG" in container["args"]
    assert pod["spec"]["nodeSelector"] == FULL["nodeSelector"]
    assert pod["spec"]["affinity"] == FULL["affinity"]  # replaces the default anti-affinity
    assert pod["spec"]["tolerations"] == FULL["podTolerations"]
    assert pod["spec"]["priorityClassName"] == "system-cluster-critical"
    assert pod["spec"]["imagePullSecrets"] == [{"name": "registry-example"}]
    assert pod["spec"]["serviceAccountName"] == "trainhook-webhook"
    assert FULL["podAnnotations"].items() <= pod["metadata"]["annotations"].items()
    assert pod["spec"]["securityContext"]["runAsUser"] == 10001
    assert find(manifests, "ServiceAccount", "trainhook-webhook")["metadata"]["annotations"] == {
        "example.com/purpose": "admission"}
    # The notary's port, the gang key's Secret of the user's and the NetworkPolicy (details: test_chart_notary.py,
    # test_chart_lifecycle.py, test_chart_hardening.py).
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert {p["containerPort"] for p in container["ports"]} == {9443, 9444}
    assert env["TRAINHOOK_WEBHOOK_GANG_KEY_SECRET"] == "ml-platform-gang-key"
    assert env["TRAINHOOK_WEBHOOK_GANG_KEY_CREATE"] == "false"
    admission, notary = find(manifests, "NetworkPolicy")["spec"]["ingress"]
    assert admission["from"] == [{"ipBlock": {"cidr": cidr}} for cidr in FULL["networkPolicy"]["apiServerCIDRs"]] + \
        FULL["networkPolicy"]["apiServerPeers"]
    assert notary == {"ports": [{"port": 9444, "protocol": "TCP"}]}


@pytest.mark.parametrize("name", ["self-managed", "self-managed-full"])
def test_the_servers_own_argument_parser_reads_what_the_chart_sets(rendered, name, monkeypatch):
    """The Deployment's args and environment, through the server's real parser: the chart speaks its language."""
    values = merged(yaml.safe_load((CHART / "values.yaml").read_text()), VALUE_SETS[name])
    container = webhook_container(rendered[name])
    assert container["command"] == ["trainhook-webhook"]
    for variable in [v for v in os.environ if v.startswith("TRAINHOOK_WEBHOOK_")]:
        monkeypatch.delenv(variable)
    for variable, value in literal_env(container).items():
        monkeypatch.setenv(variable, value)
    args = server.parse_args(container["args"])
    # self-managed serves what it keeps in its Secret from --cert-dir: no mounted files
    assert (args.tls_cert, args.tls_key, args.port) == (None, None, 9443)
    assert args.certs.cert_dir == "/tmp/trainhook-certs"
    assert args.gang_key_secret == (values["gangKey"]["existingSecret"]
                                    or f"{find(rendered[name], 'Deployment')['metadata']['name']}-gang-key")
    assert args.gang_key_create == (not values["gangKey"]["existingSecret"])  # a Secret of the user's: only read
    launcher = values["launcherImage"]
    expected_launcher = f"{launcher['repository']}:{launcher['tag'] or '0.1.0'}"
    assert args.settings.launcher_image == expected_launcher
    assert args.settings.extra_tolerations == tuple(values["tolerations"])
    assert args.settings.cluster_domain == values["clusterDomain"]
    assert args.settings.wait_timeout == values["gangWaitTimeoutSeconds"]


def test_the_default_launcher_image_is_the_servers_default(rendered):
    env = literal_env(webhook_container(rendered["self-managed"]))
    assert env["TRAINHOOK_WEBHOOK_LAUNCHER_IMAGE"] == DEFAULT_LAUNCHER_IMAGE
    assert json.loads(env["TRAINHOOK_WEBHOOK_TOLERATIONS"]) == []


@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_the_certificate_settings_name_the_objects_the_chart_renders(rendered, name):
    manifests = rendered[name]
    container = webhook_container(manifests)
    env = literal_env(container)
    assert env["TRAINHOOK_WEBHOOK_CERT_MODE"] == MODE_OF[name]
    if MODE_OF[name] == "self-managed":  # read through the API (never mounted): the one Secret its Role names
        certs_role = rules_of(manifests, "Role", f"{find(manifests, 'Deployment')['metadata']['name']}-certs")
        assert env["TRAINHOOK_WEBHOOK_SECRET_NAME"] == certs_role[1]["resourceNames"][0]
    else:
        assert env["TRAINHOOK_WEBHOOK_SECRET_NAME"] == find_secret_volume(manifests)["secretName"]
    assert env["TRAINHOOK_WEBHOOK_WEBHOOK_CONFIG_NAME"] == find(manifests, "MutatingWebhookConfiguration")[
        "metadata"]["name"]
    assert env["TRAINHOOK_WEBHOOK_SERVICE_NAME"] == find(manifests, "Service")["metadata"]["name"]
    from_fields = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"]
                   if "fieldRef" in e.get("valueFrom", {})}
    assert from_fields == {"TRAINHOOK_WEBHOOK_NAMESPACE": "metadata.namespace",
                           "TRAINHOOK_WEBHOOK_POD_NAME": "metadata.name"}


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
