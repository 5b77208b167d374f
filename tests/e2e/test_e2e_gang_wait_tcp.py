"""The tcp gang wait on the node (issue 31 item 5): its init container has the pod's token and the notary, so rank
0's barrier admits only members that prove the gang's key, and a 2-pod gang with `trainhook.dev/gang-wait: tcp`
forms and trains. In a namespace that is not one of the chart's trainingNamespaces: there the pods get the gang-wait
init container (in `default` the launcher's own barrier is the wait). The dns wait is what other e2e gangs use."""

from __future__ import annotations

import uuid

from e2e_gangs import delete_gang, phase_of, statefulset_gang
from e2e_helpers import wait_for


def test_a_tcp_gang_wait_proves_its_members_with_the_gangs_key_and_the_gang_trains(node, release, namespace):
    name = f"e2e-tcpwait-{uuid.uuid4().hex[:5]}"
    service, sts = statefulset_gang(name, node.images["torch"], ["python", "-c", "print('trained', flush=True)"], 2,
                                    annotations={"trainhook.dev/gang-wait": "tcp"})
    sts["spec"]["template"]["metadata"]["annotations"] = {"trainhook.dev/gang-wait": "tcp"}
    try:
        node.apply(namespace, [service, sts])
        # read while the pods are there: a finished gang's StatefulSet is scaled to zero
        wait_for(lambda: "with the gang's key" in node.logs(namespace, f"{name}-0", "trainhook-gang-wait"), 180,
                 "rank 0's gang wait to gather the gang with the gang's key")
        recorded = wait_for(lambda: phase_of(node, name, namespace).get("trainhook.dev/phase"), 240, f"{name}'s outcome")
        assert recorded == "Succeeded", phase_of(node, name, namespace)
    finally:
        delete_gang(node, name, namespace, wait=False)
