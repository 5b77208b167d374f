"""Nothing is lost when the notary is away (issue 31 item 4), on the real node with the chart's Deployment.

Seen before: trainhook's Deployment scaled to 0 for about a minute (a bad rollout, an eviction, a node loss) while
two 2-pod StatefulSet gangs ended, one succeeding and one failing: rank 0 logged `the outcome is not recorded` and
parked, and three minutes after the Deployment was back neither gang had a phase, an Event or a scale to zero, and
both held their pods. Now each coordinator keeps its outcome and tries again until the notary records it
(launcher/ending.py): both gangs are recorded and stopped within a minute of the Deployment's return.

The gangs start while the notary is up (each member needs its key to join), then wait for a file; the Deployment
is scaled to zero, the file is written in every pod with `kubectl exec` (through the kubelet, not trainhook), and
the gangs end while no notary answers."""

from __future__ import annotations

import time
import uuid

from e2e_gangs import NAMESPACE, delete_gang, phase_of, pods_of, statefulset, statefulset_gang
from e2e_helpers import wait_for
from test_e2e_webhook_down import deployment, scale_webhook

TRAINING = ("import os, sys, time\n"
            "print('training', flush=True)\n"
            "while not os.path.exists('/tmp/end'): time.sleep(0.2)\n"
            "code = int(os.environ.get('EXIT_CODE', '0'))\n"
            "print('ending', code, flush=True)\n"
            "sys.exit(code)\n")


def test_gangs_that_end_while_the_deployment_is_scaled_to_zero_are_recorded_and_stopped_when_it_returns(node,
                                                                                                        release):
    replicas = deployment(node)["spec"]["replicas"]
    suffix = uuid.uuid4().hex[:5]
    gangs = {f"e2e-kept-ok-{suffix}": "0", f"e2e-kept-fail-{suffix}": "3"}
    try:
        for name, fail in gangs.items():
            service, sts = statefulset_gang(name, node.images["torch"], ["python", "-c", TRAINING], 2)
            sts["spec"]["template"]["spec"]["containers"][0]["env"] = [{"name": "EXIT_CODE", "value": fail}]
            node.apply(NAMESPACE, [service, sts])
        for name in gangs:  # every member has its key and trains: the notary is not needed until the end
            wait_for(lambda name=name: len(pods_of(node, name)) == 2 and all(
                "training" in node.logs(NAMESPACE, p["metadata"]["name"], "trainer") for p in pods_of(node, name)),
                180, f"both members of {name} to train")
        scale_webhook(node, 0)
        t_down = time.monotonic()
        for name in gangs:
            for pod in pods_of(node, name):
                node.kubectl("exec", "-n", NAMESPACE, pod["metadata"]["name"], "-c", "trainer", "--", "touch",
                             "/tmp/end")
        for name in gangs:  # each gang ended, and its coordinator could not record it
            rank0 = f"{name}-0"
            wait_for(lambda rank0=rank0: "not recorded yet" in node.logs(NAMESPACE, rank0, "trainer"), 120,
                     f"{rank0} to say its outcome is not recorded yet")
            assert phase_of(node, name) == {}, phase_of(node, name)
        print(f"both gangs ended {time.monotonic() - t_down:.1f}s after the webhook went down")
        scale_webhook(node, replicas)
        t_back = time.monotonic()
        expected = {name: ("Succeeded" if fail == "0" else "Failed") for name, fail in gangs.items()}
        for name, phase in expected.items():
            recorded = wait_for(lambda name=name: phase_of(node, name).get("trainhook.dev/phase"), 60,
                                f"{name}'s outcome to be recorded within a minute of the webhook's return")
            assert recorded == phase, (name, phase_of(node, name))
            wait_for(lambda name=name: statefulset(node, name)["spec"]["replicas"] == 0, 60,
                     f"{name} to be scaled to zero")
        print(f"both recorded and stopped {time.monotonic() - t_back:.1f}s after the webhook was back")
        assert phase_of(node, f"e2e-kept-fail-{suffix}").get("trainhook.dev/exit-code") == "3"
    finally:
        if deployment(node)["spec"]["replicas"] != replicas:
            scale_webhook(node, replicas)
        for name in gangs:
            delete_gang(node, name, wait=False)
