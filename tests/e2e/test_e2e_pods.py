"""Pods on the node without trainhook: an unlabeled pod runs exactly as written (the webhook never sees it), and a
pod reaches the API server through the `kubernetes` Service, by its cluster DNS name, with its ServiceAccount."""

from __future__ import annotations

import json

from e2e_helpers import run_pod

# In-pod Python (the images have no curl): GET /version and the pod's own namespace, as any in-cluster client does.
IN_CLUSTER_CLIENT = """
import json, os, ssl, urllib.request
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
ctx = ssl.create_default_context(cafile=f"{sa}/ca.crt")
host = "https://kubernetes.default.svc"
print("env", os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"])
print("version", json.load(urllib.request.urlopen(f"{host}/version", context=ctx, timeout=10))["gitVersion"])
req = urllib.request.Request(f"{host}/api/v1/namespaces/{open(sa + '/namespace').read()}/pods",
                             headers={"Authorization": "Bearer " + open(f"{sa}/token").read()})
try:
    urllib.request.urlopen(req, context=ctx, timeout=10)
except urllib.error.HTTPError as e:
    print("pods", e.code)  # the default ServiceAccount may not list pods: 403, from the real authorizer
"""


def test_an_unlabeled_pod_runs_as_written(node, release, namespace):
    command = ["python", "-c", "import os; print('hello from', os.environ['HOSTNAME'])"]
    pod, log = run_pod(node, namespace, "plain", node.images["torch"], command)
    assert log.strip() == "hello from plain"
    spec = pod["spec"]
    assert "initContainers" not in spec
    (container,) = spec["containers"]
    assert container["command"] == command and "env" not in container
    assert [v["name"] for v in spec["volumes"]] == [v for v in [spec["volumes"][0]["name"]]
                                                     if v.startswith("default-token-")]
    assert not any(k.startswith("trainhook.dev/") for k in {**pod["metadata"].get("labels", {}),
                                                           **pod["metadata"].get("annotations", {})})


def test_a_pod_reaches_the_api_server_through_the_kubernetes_service(node, namespace):
    _, log = run_pod(node, namespace, "client", node.images["torch"], ["python", "-c", IN_CLUSTER_CLIENT])
    lines = dict(line.split(" ", 1) for line in log.strip().splitlines())
    assert lines["env"] == "10.0.0.1 443"
    assert lines["version"] == "v1.20.2"
    assert lines["pods"] == "403"
    service = json.loads(node.kubectl("get", "endpoints", "kubernetes", "-n", "default", "-o", "json"))
    assert service["subsets"][0]["addresses"][0]["ip"] == "10.244.0.1"
