"""Small gangs for the e2e tests that run the user's image (no trainhook in it) under the launcher the webhook
delivers: a labeled StatefulSet and its headless Service, the user's command only, 100m CPU per pod (the node has
2 cores). Used by test_e2e_gang_failure.py, test_e2e_status.py and test_e2e_webhook_down.py."""

from __future__ import annotations

import copy
import json

import yaml

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


def example_documents(path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def for_the_node(documents: list[dict], image: str, cpu: str = "100m") -> list[dict]:
    """An example's manifests as this node runs them: the local image (never pulled), `cpu` per pod (2 cores),
    a short termination grace, and each Indexed Job turned into a StatefulSet of the same name, labels,
    annotations, size and pod template (v1.20 has no Indexed Jobs; a multi-role gang is one workload per role
    either way, and its pods are then <job>-<role>-<index>.<job> as the Job's would be named by their hostnames).
    Services and ConfigMaps pass unchanged."""
    out = []
    for doc in copy.deepcopy(documents):
        if doc["kind"] == "Job":
            name, spec = doc["metadata"]["name"], doc["spec"]
            service = doc["metadata"]["labels"].get("trainhook.dev/job-name", name)
            template = spec["template"]
            template["spec"].pop("restartPolicy", None)  # a StatefulSet's pods restart Always
            template.setdefault("metadata", {}).setdefault("labels", {})["app"] = name
            doc = {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": doc["metadata"],
                   "spec": {"serviceName": service, "replicas": spec.get("completions", 1),
                            "podManagementPolicy": "Parallel", "selector": {"matchLabels": {"app": name}},
                            "template": template}}
        if doc["kind"] == "StatefulSet":
            pod_spec = doc["spec"]["template"]["spec"]
            pod_spec["terminationGracePeriodSeconds"] = 5
            for container in pod_spec["containers"]:
                container["image"], container["imagePullPolicy"] = image, "Never"
                container.setdefault("resources", {}).setdefault("requests", {})["cpu"] = cpu
        out.append(doc)
    return out


def apply_gang(node, documents: list[dict], namespace: str = NAMESPACE) -> None:
    """Apply an example's manifests after deleting what a previous run may have left of them."""
    delete_documents(node, documents, namespace, wait=True)
    node.apply(namespace, documents)


def delete_documents(node, documents: list[dict], namespace: str = NAMESPACE, wait: bool = False) -> None:
    for doc in documents:
        node.kubectl("delete", "-n", namespace, doc["kind"].lower(), doc["metadata"]["name"], "--ignore-not-found",
                     "--wait=false", check=False)
    if wait:
        apps = [d["spec"]["selector"]["matchLabels"]["app"] for d in documents if d["kind"] == "StatefulSet"]
        wait_for(lambda: not any(pods_of(node, app, namespace) for app in apps), 60, f"the pods of {apps} to go")


def phase_of(node, name: str, namespace: str = NAMESPACE) -> dict:
    """The outcome annotations of StatefulSet `name` ({} while it runs)."""
    annotations = statefulset(node, name, namespace)["metadata"].get("annotations") or {}
    return {k: v for k, v in annotations.items() if k.startswith("trainhook.dev/phase") or
            k == "trainhook.dev/exit-code"}
