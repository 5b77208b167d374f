"""The webhook on the node, called by the API server through the chart's Service: a labeled StatefulSet and its
Service are mutated (the pods as the StatefulSet controller creates them carry the gang's environment and the
gang-wait init container from the local launcher image), and that init container, asked for a dns wait
(`trainhook.dev/gang-wait: dns`; with the launcher delivered it only installs by default), finds every peer through
the cluster DNS before the training container starts."""

from __future__ import annotations

import json

from e2e_helpers import wait_for


def gang(node, replicas: int) -> list[dict]:
    labels = {"trainhook.dev/framework": "pytorch"}
    return [
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "gang", "labels": {"trainhook.dev/job-name": "gang"}},
         "spec": {"clusterIP": "None", "selector": {"trainhook.dev/job-name": "gang"}}},
        {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "gang", "labels": labels},
         "spec": {"serviceName": "gang", "replicas": replicas, "selector": {"matchLabels": {"app": "gang"}},
                  "template": {"metadata": {"labels": {"app": "gang", **labels},
                                            "annotations": {"trainhook.dev/gang-wait": "dns"}}, "spec": {
                      "terminationGracePeriodSeconds": 1,
                      "containers": [{"name": "trainer", "image": node.images["torch"], "imagePullPolicy": "Never",
                                      "command": ["sleep", "3600"],
                                      "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}}}]}}}},
    ]


def test_a_labeled_statefulset_is_mutated_through_the_webhook_pods(node, release, namespace):
    node.apply(namespace, gang(node, 3))
    service = json.loads(node.kubectl("get", "service", "gang", "-n", namespace, "-o", "json"))
    assert service["spec"]["publishNotReadyAddresses"] is True

    def created():
        pods = json.loads(node.kubectl("get", "pods", "-n", namespace, "-l", "app=gang", "-o", "json"))["items"]
        return pods if len(pods) == 3 else None
    pods = sorted(wait_for(created, 60, "the StatefulSet's 3 pods"), key=lambda p: p["metadata"]["name"])
    for rank, pod in enumerate(pods):
        spec = pod["spec"]
        trainer = next(c for c in spec["containers"] if c["name"] == "trainer")
        env = {e["name"]: e.get("value") for e in trainer.get("env", [])}
        assert env["WORLD_SIZE"] == "3" and env["RANK"] == str(rank), env
        assert env["MASTER_ADDR"].split(".")[:2] == ["gang-0", "gang"], env  # rank 0, through the headless Service
        assert env["PET_NNODES"] == "3" and env["PET_NODE_RANK"] == str(rank)
        (wait,) = [c for c in spec["initContainers"] if c["name"] == "trainhook-gang-wait"]
        assert wait["image"] == node.images["launcher"]

    def peers_found():
        current = json.loads(node.kubectl("get", "pods", "-n", namespace, "-l", "app=gang", "-o", "json"))["items"]
        states = [s.get("state", {}) for p in current for s in p["status"].get("initContainerStatuses", [])
                  if s["name"] == "trainhook-gang-wait"]
        failed = [s for s in states if s.get("terminated", {}).get("exitCode", 0) != 0]
        assert not failed, failed
        return len(states) == 3 and all(s.get("terminated", {}).get("exitCode") == 0 for s in states)
    wait_for(peers_found, 120, "every pod's gang-wait init container to find its peers and exit 0")
