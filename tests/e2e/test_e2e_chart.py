"""The chart, installed for real by Helm on the node (Kubernetes 1.20) with nothing but the local images' values and
pull policy: the webhook's pods become Ready, its self-managed certificates are created, the caBundle is injected,
and the API server calls the webhook through its Service (tests/e2e/test_e2e_webhook.py shows the calls' effect)."""

from __future__ import annotations

import base64
import json

from cryptography import x509

from e2e_helpers import RELEASE, RELEASE_NAMESPACE


def get(node, *args: str) -> dict:
    return json.loads(node.kubectl("get", *args, "-o", "json"))


def test_helm_installs_the_chart_and_both_webhook_replicas_become_ready(node, release):
    deployment = get(node, "deployment", RELEASE, "-n", RELEASE_NAMESPACE)
    assert deployment["status"].get("readyReplicas") == 2 == deployment["spec"]["replicas"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == node.images["webhook"] and container["imagePullPolicy"] == "Never"
    pods = [p for p in get(node, "pods", "-n", RELEASE_NAMESPACE, "-l", "app.kubernetes.io/name=trainhook")["items"]
            if not p["metadata"].get("deletionTimestamp")]  # an upgrade's old pods may still be terminating
    assert len(pods) == 2
    assert all(p["status"]["phase"] == "Running" and p["spec"]["nodeName"] == "trainhook-node" for p in pods)
    # The Service the API server calls has both pods behind it.
    endpoints = get(node, "endpoints", RELEASE, "-n", RELEASE_NAMESPACE)
    ready = {a["ip"] for s in endpoints.get("subsets") or [] for a in s.get("addresses") or []}
    assert ready == {p["status"]["podIP"] for p in pods}
    print(f"helm upgrade --install --wait took {release:.1f}s")


def test_the_self_managed_certificates_are_created_and_the_ca_bundle_injected(node, release):
    secret = get(node, "secret", f"{RELEASE}-tls", "-n", RELEASE_NAMESPACE)
    serving = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    names = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName)
    assert f"{RELEASE}.{RELEASE_NAMESPACE}.svc" in names
    config = get(node, "mutatingwebhookconfiguration", RELEASE)
    bundles = {w["clientConfig"]["caBundle"] for w in config["webhooks"]}
    # Pods, the workloads and Services, and the scale subresource (webhook/admission/scale.py): one CA for all three.
    assert len(config["webhooks"]) == 3 and len(bundles) == 1
    # The trust bundle (newest CA first, more than one only during a rotation) holds the serving certificate's CA.
    (issuer,) = [ca for ca in x509.load_pem_x509_certificates(base64.b64decode(bundles.pop()))
                 if ca.subject == serving.issuer]
    serving.verify_directly_issued_by(issuer)


def test_the_disruption_budget_is_the_one_1_20_serves(node, release):
    budget = get(node, "poddisruptionbudgets.v1beta1.policy", RELEASE, "-n", RELEASE_NAMESPACE)
    assert budget["apiVersion"] == "policy/v1beta1"
    assert budget["spec"]["minAvailable"] == 1
    assert budget["status"]["currentHealthy"] == 2
