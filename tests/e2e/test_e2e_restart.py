"""`restart-gang` on the node, through a real container restart: a 3-pod StatefulSet gang of the user's torch image
(nothing of trainhook in it) with `trainhook.dev/on-failure: restart-gang`. In attempt 1 every rank trains
(sleeps); the test then kills rank 1's container from the host through containerd, as an OOM kill would (exit
137, retryable). The kubelet restarts that container (restartPolicy Always); the coordinator (rank 0) stops the
other ranks' training; when the restarted member's new launcher has connected, attempt 2 starts on every rank
together, and this time the training ends: the gang succeeds after one gang restart, and no rank trains a third
time. Only the killed member's container was restarted: the others' launchers stopped and restarted their
training in place (docs/use/gang-lifecycle.md, "How it works" 4)."""

from __future__ import annotations

import re

from e2e_gangs import NAMESPACE, delete_gang, phase_of, pods_of, statefulset, statefulset_gang
from e2e_helpers import LogFollower, shown_on_failure, wait_for

NAME = "e2e-restart"
SCRIPT = """
import os, signal, sys, time
rank, attempt = int(os.environ["RANK"]), int(os.environ["TRAINHOOK_ATTEMPT"])
restarts = os.environ["TRAINHOOK_RESTARTS"]
print(f"rank {rank}: attempt {attempt} started (gang restarts so far: {restarts}, port {os.environ['MASTER_PORT']})",
      flush=True)
signal.signal(signal.SIGTERM, lambda *_: (print(f"rank {rank}: attempt {attempt} stopped", flush=True), sys.exit(143)))
time.sleep(300 if attempt == 1 else 3)
print(f"rank {rank}: attempt {attempt} finished", flush=True)
"""
STARTED = re.compile(r"rank (\d): attempt (\d) started \(gang restarts so far: (\d), port (\d+)\)")


def restart_counts(node) -> dict[str, int]:
    return {p["metadata"]["name"]: sum(s["restartCount"] for s in p["status"].get("containerStatuses") or [])
            for p in pods_of(node, NAME)}


def test_restart_gang_restarts_the_whole_gang_after_a_member_container_is_killed(node, release):
    delete_gang(node, NAME)
    pods = [f"{NAME}-{i}" for i in range(3)]
    followers: dict[str, LogFollower] = {}
    try:
        node.apply(NAMESPACE, statefulset_gang(NAME, node.images["torch"], ["python", "-c", SCRIPT], 3,
                                               annotations={"trainhook.dev/on-failure": "restart-gang",
                                                            "trainhook.dev/max-restarts": "2"}))
        for pod in pods:
            followers[pod] = LogFollower(node, NAMESPACE, pod, "trainer", restarts=True)
        with shown_on_failure(node, NAMESPACE, followers):
            wait_for(lambda: all("attempt 1 started" in f.text for f in followers.values()), 120,
                     "attempt 1 to start on every rank", interval=1)
            killed = node.kill_container(NAMESPACE, f"{NAME}-1", "trainer")
            # The kubelet restarts the killed container, and only that one.
            counts = wait_for(lambda: (c := restart_counts(node)).get(f"{NAME}-1") == 1 and c, 60,
                              f"the kubelet to restart {NAME}-1's container {killed[:12]}")
            assert counts == {pods[0]: 0, pods[1]: 1, pods[2]: 0}, counts

            def succeeded():
                phase = phase_of(node, NAME)
                assert phase.get("trainhook.dev/phase") != "Failed", phase
                return phase.get("trainhook.dev/phase") == "Succeeded" and phase
            phase = wait_for(succeeded, 120, "the restarted gang to succeed", interval=1)
            wait_for(lambda: all("attempt 2 finished" in f.text for f in followers.values()), 30,
                     "every rank's log to show attempt 2 finished")
        assert phase["trainhook.dev/exit-code"] == "0", phase
        ports = set()
        for rank, pod in enumerate(pods):
            text = followers[pod].text
            started = STARTED.findall(text)
            # Attempt 1 then attempt 2 (after one gang restart), each once; never a third.
            assert [(a, r) for _, a, r, _ in started] == [("1", "0"), ("2", "1")], (pod, text[-3000:])
            assert all(r == str(rank) for r, _, _, _ in started), (pod, started)
            ports |= {(a, p) for _, a, _, p in started}
            assert "attempt 1 finished" not in text, (pod, text[-3000:])
            if pod != f"{NAME}-1":  # stopped by its launcher; rank 1's training died with its container
                assert "rank %d: attempt 1 stopped" % rank in text, (pod, text[-3000:])
        # Each attempt is a fresh rendezvous: torch's MASTER_PORT moves by attempt - 1.
        by_attempt = {a: {int(p) for aa, p in ports if aa == a} for a in ("1", "2")}
        assert len(by_attempt["1"]) == len(by_attempt["2"]) == 1, by_attempt
        assert by_attempt["2"] == {by_attempt["1"].pop() + 1}
        wait_for(lambda: statefulset(node, NAME)["spec"]["replicas"] == 0, 60, "the StatefulSet scaled to zero")
    finally:
        for follower in followers.values():
            follower.stop()
        delete_gang(node, NAME, wait=False)
