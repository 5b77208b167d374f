"""Cluster DNS as pods see it (hack/cluster_dns.py behind the kube-dns Service; kubelet's resolv.conf and search
path): a headless Service's pod hostnames under their subdomain, a not-ready pod resolving only when the Service
sets publishNotReadyAddresses (what trainhook's gang-wait relies on), and the Service names themselves."""

from __future__ import annotations

import json

from e2e_helpers import run_pod, wait_for

# Resolve each name through the pod's resolver (search path included); print name, then the sorted addresses or
# the error.
RESOLVE = """
import socket, sys
for name in sys.argv[1:]:
    try:
        print(name, ",".join(sorted({a[4][0] for a in socket.getaddrinfo(name, None, socket.AF_INET)})))
    except socket.gaierror as e:
        print(name, "ERROR", e.errno)
"""


def headless(name: str, publish_not_ready: bool) -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
            "spec": {"clusterIP": "None", "selector": {"app": "web"}, "publishNotReadyAddresses": publish_not_ready,
                     "ports": [{"name": "http", "port": 8080}]}}


def test_a_headless_service_resolves_pod_hostnames_and_not_ready_pods_only_when_published(node, namespace):
    # Two pods that never become Ready (their readiness probe always fails), like a gang's pods before training.
    statefulset = {
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "web"},
        "spec": {"serviceName": "web", "replicas": 2, "podManagementPolicy": "Parallel",
                 "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}}, "spec": {
                     "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "main", "image": node.images["torch"], "imagePullPolicy": "Never",
                                     "command": ["sleep", "3600"],
                                     "readinessProbe": {"exec": {"command": ["false"]}, "periodSeconds": 1}}]}}}}
    node.apply(namespace, [headless("web", True), headless("strict", False), statefulset])

    def running_ips():
        pods = json.loads(node.kubectl("get", "pods", "-n", namespace, "-l", "app=web", "-o", "json"))["items"]
        if len(pods) == 2 and all(p["status"].get("phase") == "Running" and p["status"].get("podIP") for p in pods):
            return {p["metadata"]["name"]: p["status"]["podIP"] for p in pods}
    ips = wait_for(running_ips, 90, "both web pods Running")
    pods = json.loads(node.kubectl("get", "pods", "-n", namespace, "-l", "app=web", "-o", "json"))["items"]
    assert not any(c["ready"] for p in pods for c in p["status"]["containerStatuses"])

    def endpoints_listed():
        eps = json.loads(node.kubectl("get", "endpoints", "web", "-n", namespace, "-o", "json"))
        return len([a for s in eps.get("subsets") or [] for a in s.get("addresses") or []]) == 2
    wait_for(endpoints_listed, 30, "the not-ready pods in the web Service's addresses")

    names = ["web-0.web", "web-1.web", f"web-0.web.{namespace}.svc.cluster.local", "web",
             "web-0.strict", "strict", "kubernetes.default", "nothing-here", "pypi.org"]
    _, log = run_pod(node, namespace, "resolver", node.images["torch"], ["python", "-c", RESOLVE, *names])
    got = dict(line.split(" ", 1) for line in log.strip().splitlines())
    assert got["web-0.web"] == ips["web-0"]
    assert got["web-1.web"] == ips["web-1"]
    assert got[f"web-0.web.{namespace}.svc.cluster.local"] == ips["web-0"]
    assert got["web"] == ",".join(sorted(ips.values()))
    # The same pods behind a Service that does not publish them: nothing until they are Ready.
    assert got["web-0.strict"].startswith("ERROR") and got["strict"].startswith("ERROR")
    assert got["kubernetes.default"] == "10.0.0.1"
    assert got["nothing-here"].startswith("ERROR")
    assert got["pypi.org"].startswith("ERROR")  # no upstream: pods never leave this machine
