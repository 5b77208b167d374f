"""A failing member ends the whole gang on the node (docs/use/gang-lifecycle.md, "Failure"): a 3-pod StatefulSet
of the user's torch image (nothing of trainhook in it) whose rank 2 exits 3 after 2 s while the others would
sleep 300 s. Under the launcher the webhook delivers, every other member's training is stopped within 10 s of the
failure, the StatefulSet records Failed with exit code 3 and a reason naming rank 2, and it is scaled to zero so
no member trains again.

The times are the training processes' own (the node is one machine, one clock): rank 2 prints the moment it exits,
the others the moment SIGTERM reaches them (and then exit)."""

from __future__ import annotations

import re
import time

from e2e_gangs import NAMESPACE, delete_gang, pods_of, statefulset, statefulset_gang
from e2e_helpers import LogFollower, shown_on_failure, wait_for

NAME = "e2e-fail"
SCRIPT = """
import os, signal, sys, time
rank = int(os.environ.get("TRAINHOOK_RANK") or os.environ["RANK"])
def stopped(signum, frame):
    print(f"rank {rank}: stopped by signal {signum} at {time.time():.3f}", flush=True)
    sys.exit(143)
signal.signal(signal.SIGTERM, stopped)
print(f"rank {rank}: training started", flush=True)
if rank == 2:
    time.sleep(2)
    print(f"rank {rank}: failing at {time.time():.3f}", flush=True)
    sys.exit(3)
time.sleep(300)
print(f"rank {rank}: slept through", flush=True)
"""
FAILED_AT = re.compile(r"rank 2: failing at ([0-9.]+)")
STOPPED_AT = re.compile(r"rank (\d): stopped by signal \d+ at ([0-9.]+)")


def test_a_failing_rank_stops_the_whole_gang_and_it_does_not_rerun(node, release):
    delete_gang(node, NAME)
    followers: dict[str, LogFollower] = {}
    t0 = time.monotonic()
    try:
        node.apply(NAMESPACE, statefulset_gang(NAME, node.images["torch"], ["python", "-c", SCRIPT], 3))
        for i in range(3):
            followers[f"{NAME}-{i}"] = LogFollower(node, NAMESPACE, f"{NAME}-{i}", "trainer")

        def failed():
            annotations = statefulset(node, NAME)["metadata"].get("annotations", {})
            assert annotations.get("trainhook.dev/phase") != "Succeeded", annotations
            return annotations.get("trainhook.dev/phase") == "Failed" and annotations
        with shown_on_failure(node, NAMESPACE, followers):
            annotations = wait_for(failed, 90, "the gang to record Failed on its StatefulSet", interval=1)
            # Scaled to zero: the controller deletes the pods, and nothing restarts the training.
            wait_for(lambda: statefulset(node, NAME)["spec"]["replicas"] == 0, 30, "the StatefulSet scaled to 0")
            wait_for(lambda: all("training started" in f.text and "trainhook-launch" in f.text
                                 for f in followers.values()) and
                     len(STOPPED_AT.findall(followers[f"{NAME}-0"].text + followers[f"{NAME}-1"].text)) == 2,
                     30, "every member's log to show its training started and stopped")
            wait_for(lambda: not pods_of(node, NAME), 60, "the gang's pods to be deleted by the scale to zero")

        assert annotations["trainhook.dev/exit-code"] == "3", annotations
        reason = annotations["trainhook.dev/phase-reason"]
        assert re.search(r"\brank 2\b", reason) and "3" in reason, reason

        logs = {name: f.text for name, f in followers.items()}
        failed_at = float(FAILED_AT.search(logs[f"{NAME}-2"]).group(1))
        for rank in (0, 1):
            (stopped,) = [float(t) for r, t in STOPPED_AT.findall(logs[f"{NAME}-{rank}"]) if r == str(rank)]
            took = stopped - failed_at
            print(f"rank {rank} stopped {took:.2f}s after rank 2 failed")
            assert 0 <= took < 10, (rank, took, logs[f"{NAME}-{rank}"][-2000:])
        for name, text in logs.items():  # each member trained exactly once: no restart, no rerun
            assert text.count("training started") == 1, (name, text[-2000:])
            assert "slept through" not in text, (name, text[-2000:])
        print(f"failure test took {time.monotonic() - t0:.1f}s")
    finally:
        for follower in followers.values():
            follower.stop()
        delete_gang(node, NAME, wait=False)
