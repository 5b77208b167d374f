"""examples/pytorch/ddp.yaml trains for real on the node: 4 pods, torch's gloo over the pod network, peers found
through the cluster DNS, every rank ending with the same parameters.

The user's manifest runs unchanged but for its image: the local CPU torch image (images/examples/torch.Dockerfile:
Python and torch, nothing of trainhook), with the example's own command. The webhook delivers the launcher into
the pods and runs the command under it, which is what makes the finished gang record its outcome, scale to zero
and never train twice.

Also changed from the example, for this 2-core node: each pod requests 100m CPU instead of 500m (4 x 500m and the
webhook's requests do not fit), and the gang runs in `default`, whose ServiceAccounts the chart's default values
bind to the training role (so the launcher may record the outcome and scale the finished StatefulSet to zero).
"""

from __future__ import annotations

import base64
import copy
import json
import re

import yaml

from e2e_helpers import LogFollower, REPO, shown_on_failure, wait_for

DIGEST = re.compile(r"final parameters digest ([0-9a-f]+) identical-across-ranks=True")
NAMESPACE = "default"


def ddp_manifests(image: str) -> list[dict]:
    objects = [o for o in yaml.safe_load_all((REPO / "examples" / "pytorch" / "ddp.yaml").read_text()) if o]
    out = []
    for obj in objects:
        obj = copy.deepcopy(obj)
        if obj["kind"] == "StatefulSet":
            template = obj["spec"]["template"]
            template["spec"]["terminationGracePeriodSeconds"] = 5
            (trainer,) = template["spec"]["containers"]
            trainer["image"], trainer["imagePullPolicy"] = image, "Never"
            trainer["resources"]["requests"]["cpu"] = "100m"
        out.append(obj)
    return out


def test_the_pytorch_ddp_example_trains_across_four_pods(node, release):
    manifests = ddp_manifests(node.images["torch"])
    node.kubectl("delete", "-n", NAMESPACE, "statefulset,service,configmap", "ddp", "ddp-script",
                 "--ignore-not-found", "--wait=true", check=False)
    followers: dict[str, LogFollower] = {}
    try:
        node.apply(NAMESPACE, manifests)
        for i in range(4):
            followers[f"ddp-{i}"] = LogFollower(node, NAMESPACE, f"ddp-{i}", "trainer")
        # The command is the user's, under the delivered launcher, which the pod mounts from the webhook's
        # ConfigMap in this training namespace (the chart's trainingNamespaces): no init container.
        spec = wait_for(lambda: node.pod(NAMESPACE, "ddp-1")["spec"], 60, "pod ddp-1")
        assert spec["containers"][0]["command"] == [
            "/trainhook/bin/trainhook-launch", "run", "--", "torchrun", "/workspace/ddp.py"]
        assert "initContainers" not in spec, spec
        (launcher,) = [v for v in spec["volumes"] if v["name"] == "trainhook-launcher"]
        config_map = json.loads(node.kubectl("get", "configmap", launcher["configMap"]["name"], "-n", NAMESPACE,
                                             "-o", "json"))
        # The webhook image's static entry program (no shell needed) and the launcher's zip, both binary.
        assert set(config_map["binaryData"]) == {"launcher.pyz", "trainhook-launch"}, sorted(config_map)
        assert not config_map.get("data"), config_map.get("data")
        assert base64.b64decode(config_map["binaryData"]["trainhook-launch"])[:4] == b"\x7fELF"

        def finished():
            sts = json.loads(node.kubectl("get", "statefulset", "ddp", "-n", NAMESPACE, "-o", "json"))
            phase = sts["metadata"].get("annotations", {}).get("trainhook.dev/phase")
            assert phase != "Failed", sts["metadata"]["annotations"]
            digests = {name: DIGEST.search(f.text) for name, f in followers.items()}
            return phase == "Succeeded" and all(digests.values()) and (sts, digests)
        with shown_on_failure(node, NAMESPACE, followers):
            sts, digests = wait_for(finished, 300, "the 4 ranks to train and the gang to succeed", interval=2)
        assert len({m.group(1) for m in digests.values()}) == 1, digests
        assert "epoch 5 loss" in followers["ddp-0"].text
        for name, follower in followers.items():  # each rank trained once, under the delivered launcher
            assert follower.text.count(": training") == 1, follower.text[-2000:]
            assert "trainhook-launch run: gang succeeded" in follower.text
        # The launcher recorded the outcome and scaled the finished StatefulSet to zero: it does not retrain.
        assert sts["metadata"]["annotations"]["trainhook.dev/exit-code"] == "0"
        wait_for(lambda: json.loads(node.kubectl("get", "statefulset", "ddp", "-n", NAMESPACE, "-o", "json"))
                 ["spec"]["replicas"] == 0, 60, "the finished StatefulSet scaled to zero")
    finally:
        for follower in followers.values():
            follower.stop()
        node.kubectl("delete", "-n", NAMESPACE, "statefulset,service,configmap", "ddp", "ddp-script",
                     "--ignore-not-found", "--wait=false", check=False)
