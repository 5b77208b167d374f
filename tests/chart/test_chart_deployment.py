"""The webhook's Deployment as the chart renders it for every value set (conftest.py's `rendered`): hardened,
probed, spread, budgeted, and what it passes to the server is what the server's own parser reads."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from chart_render import CHART, find, find_all, render_chart, render_notes
from chart_sets import (FULL, MODE_OF, NAMESPACE, VALUE_SETS, find_secret_volume, literal_env, merged, rules_of,
                        webhook_container)
from trainhook.webhook import server
from trainhook.webhook.settings import DEFAULT_LAUNCHER_IMAGE


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
