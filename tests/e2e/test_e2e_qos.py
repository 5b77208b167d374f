"""A Guaranteed gang stays Guaranteed on the node: the gang-wait init container the webhook adds (a namespace that
is not one of the chart's trainingNamespaces) has requests equal to its limits, so the API server classes the pod
Guaranteed and the kubelet runs its training in the Guaranteed pods' cgroup, not the Burstable ones'
(webhook/admission/resources.py's wait_resources). Before, every labeled Guaranteed pod there became Burstable."""

from __future__ import annotations

import uuid

from e2e_gangs import delete_gang, statefulset_gang
from e2e_helpers import wait_for

# The training prints its own cgroup (the kubelet's QoS tier is in its path), then stays while the test reads it.
PRINT_CGROUP = "import time; print('CGROUP', open('/proc/self/cgroup').read().replace(chr(10), ' '), flush=True); " \
               "time.sleep(60)"


def test_a_guaranteed_gang_stays_guaranteed_with_the_gang_wait_init_container(node, release, namespace):
    name = f"e2e-qos-{uuid.uuid4().hex[:5]}"
    service, sts = statefulset_gang(name, node.images["torch"], ["python", "-c", PRINT_CGROUP], 2)
    trainer = sts["spec"]["template"]["spec"]["containers"][0]
    trainer["resources"] = {"limits": {"cpu": "100m", "memory": "256Mi"}}  # requests default to the limits
    try:
        node.apply(namespace, [service, sts])
        line = wait_for(lambda: next((li for li in node.logs(namespace, f"{name}-1").splitlines()
                                      if li.startswith("CGROUP")), None), 180, "rank 1's training to start")
        pod = node.pod(namespace, f"{name}-1")
        [wait] = [c for c in pod["spec"]["initContainers"] if c["name"] == "trainhook-gang-wait"]
        assert wait["resources"]["requests"] == wait["resources"]["limits"], wait["resources"]
        assert pod["status"]["qosClass"] == "Guaranteed", pod["status"]
        tiers = line.lower()
        assert "kubepods" in tiers and "burstable" not in tiers and "besteffort" not in tiers, line
    finally:
        delete_gang(node, name, namespace, wait=False)
