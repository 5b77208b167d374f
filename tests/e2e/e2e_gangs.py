"""Small gangs for the e2e tests that run the user's image (no trainhook in it) under the launcher the webhook
delivers: a labeled StatefulSet and its headless Service, the user's command only, 100m CPU per pod (the node has
2 cores). Used by test_e2e_gang_failure.py, test_e2e_status.py and test_e2e_webhook_down.py."""

from __future__ import annotations

import json

from e2e_helpers import wait_for

NAMESPACE = "default"  # the chart binds the training role to default's ServiceAccounts: outcomes, scale to zero


def statefulset_gang(name: str, image: str, command: list[str], replicas: int, framework: str = "pytorch",
                     annotations: dict[str, str] | None = None, cpu: str = "100m") -> list[dict]:
    labels = {"trainhook.dev/framework": framework}
    return [
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": name, "labels": {"trainhook.dev/job-name": name}},
         "spec": {"clusterIP": "None", "selector": {"trainhook.dev/job-name": name}}},
        {"apiVersion": "apps/v1", "kind": "StatefulSet",
         "metadata": {"name": name, "labels": labels, "annotations": annotations or {}},
         "spec": {"serviceName": name, "replicas": replicas, "podManagementPolicy": "Parallel",
                  "selector": {"matchLabels": {"app": name}},
                  "template": {"metadata": {"labels": {"app": name, **labels}}, "spec": {
                      "terminationGracePeriodSeconds": 5,
                      "containers": [{"name": "trainer", "image": image, "imagePullPolicy": "Never",
                                      "command": command,
                                      "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}}}]}}}},
    ]


def statefulset(node, name: str, namespace: str = NAMESPACE) -> dict:
    return json.loads(node.kubectl("get", "statefulset", name, "-n", namespace, "-o", "json"))


def pods_of(node, name: str, namespace: str = NAMESPACE) -> list[dict]:
    pods = json.loads(node.kubectl("get", "pods", "-n", namespace, "-l", f"app={name}", "-o", "json"))["items"]
    return sorted(pods, key=lambda p: p["metadata"]["name"])


def delete_gang(node, name: str, namespace: str = NAMESPACE, wait: bool = True) -> None:
    """The gang's StatefulSet and Service, and (with `wait`) its pods gone, so a rerun starts clean."""
    node.kubectl("delete", "-n", namespace, "statefulset,service", name, "--ignore-not-found",
                 "--wait=false", check=False)
    if wait:
        node.kubectl("delete", "pods", "-n", namespace, "-l", f"app={name}", "--ignore-not-found",
                     "--grace-period=1", "--wait=false", check=False)
        wait_for(lambda: not pods_of(node, name, namespace), 60, f"the pods of {name} to go")
