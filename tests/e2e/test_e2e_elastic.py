"""Elastic PyTorch on the node (issue 18): examples/pytorch/elastic.yaml (image swapped for the local torch image)
trains while `kubectl scale` takes it 2 -> 3 -> 2 workers through the real scale subresource, which the webhook
checks; the training's own lines say the world size went 2 -> 3 -> 2 and the step counter went on from the
checkpoint across every rendezvous round. And `kubectl scale` of a fixed-size gang is refused by the API server
with the webhook's message, so no pod is ever created and refused over and over.

Changed from the example for this one node: the checkpoint volume is a hostPath directory (no ReadWriteMany
provisioner here; every pod is on this node, so they share it as they would share an NFS volume), 100m CPU."""

from __future__ import annotations

import re
import uuid

import pytest

from e2e_gangs import (NAMESPACE, apply_gang, delete_documents, example_documents, for_the_node, phase_of, pods_of,
                       statefulset, statefulset_gang)
from e2e_helpers import REPO, LogFollower, shown_on_failure, wait_for

STEP = re.compile(r"^elastic: step (\d+) world (\d+) ", re.M)
ROUND = re.compile(r"^elastic: round \d+ world (\d+) resumes at step (\d+)$", re.M)
STEPS = 90


def elastic_documents(node) -> list[dict]:
    documents = [d for d in for_the_node(example_documents(REPO / "examples" / "pytorch" / "elastic.yaml"),
                                         node.images["torch"]) if d["kind"] != "PersistentVolumeClaim"]
    sts = next(d for d in documents if d["kind"] == "StatefulSet")
    spec = sts["spec"]["template"]["spec"]
    spec["volumes"] = [v for v in spec["volumes"] if v["name"] != "checkpoints"] + [
        {"name": "checkpoints", "hostPath": {"path": f"/tmp/trainhook-e2e-elastic-{uuid.uuid4().hex[:8]}",
                                             "type": "DirectoryOrCreate"}}]
    (container,) = spec["containers"]
    container["env"] = [e for e in container["env"] if e["name"] != "STEPS"] + [
        {"name": "STEPS", "value": str(STEPS)}, {"name": "STEP_SECONDS", "value": "0.4"}]
    return documents


def scale(node, name: str, replicas: int, check: bool = True) -> str:
    return node.kubectl("scale", "-n", NAMESPACE, f"statefulset/{name}", f"--replicas={replicas}", check=check)


def test_an_elastic_gang_trains_on_while_scaled_2_3_2_and_resumes_its_step_counter(node, release):
    documents = elastic_documents(node)
    follower = None
    try:
        apply_gang(node, documents)
        follower = LogFollower(node, NAMESPACE, "elastic-0", "trainer")
        with shown_on_failure(node, NAMESPACE, {"elastic-0": follower}):
            wait_for(lambda: "elastic: step 6 world 2 " in follower.text, 240, "6 steps on 2 workers", interval=1)
            scale(node, "elastic", 3)
            wait_for(lambda: len(re.findall(r"elastic: step \d+ world 3 ", follower.text)) >= 4, 180,
                     "4 steps on 3 workers", interval=1)
            scale(node, "elastic", 2)

            def succeeded():
                phase = phase_of(node, "elastic")
                assert phase.get("trainhook.dev/phase") != "Failed", phase
                return phase.get("trainhook.dev/phase") == "Succeeded" and "elastic: done at step" in follower.text
            wait_for(succeeded, 300, "the elastic gang to finish its steps and succeed", interval=2)
        text = follower.text
        steps = [(int(s), int(w)) for s, w in STEP.findall(text)]
        worlds = [w for i, (_, w) in enumerate(steps) if i == 0 or steps[i - 1][1] != w]
        assert worlds == [2, 3, 2], steps
        counters = [s for s, _ in steps]
        assert counters[0] == 1 and counters[-1] == STEPS and set(counters) == set(range(1, STEPS + 1))
        # Every rendezvous round resumes from the checkpoint: the counter never goes back to 0.
        rounds = [(int(w), int(s)) for w, s in ROUND.findall(text)]
        assert rounds[0] == (2, 0) and [w for w, _ in rounds[1:]] == [3, 2] and all(s > 0 for _, s in rounds[1:])
        assert statefulset(node, "elastic")["metadata"]["annotations"]["trainhook.dev/exit-code"] == "0"
    finally:
        if follower is not None:
            follower.stop()
        delete_documents(node, documents)


def test_kubectl_scale_of_a_fixed_size_gang_is_refused_with_the_fix(node, release):
    name = "e2e-fixed"
    documents = statefulset_gang(name, node.images["torch"], ["sleep", "300"], 2, cpu="10m")
    try:
        apply_gang(node, documents)
        # Its pods exist: the webhook's StatefulSet watch has long seen it (a scale before that is let through).
        wait_for(lambda: len(pods_of(node, name)) == 2, 60, "the gang's 2 pods")
        with pytest.raises(AssertionError) as refused:
            scale(node, name, 3)
        message = str(refused.value)
        assert "admission webhook" in message and "denied the request" in message, message
        assert f"StatefulSet {NAMESPACE}/{name}" in message and "trainhook.dev/elastic" in message, message
        assert "kubectl apply" in message, message  # the fix: change spec.replicas, or make it elastic
        assert statefulset(node, name)["spec"]["replicas"] == 2
        assert scale(node, name, 0)  # scaling a gang to zero (what the launcher does when it ends) is allowed
    finally:
        delete_documents(node, documents)
