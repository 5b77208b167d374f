"""The user's commands against a real gang on the node: a 2-pod StatefulSet of the user's torch image (nothing of
trainhook in it) whose command prints `done` after 4 s (so `trainhook logs -f`, which polls a pod once a second
until its container starts, sees the containers running before the scale to zero deletes them). Under the launcher the webhook delivers, the gang succeeds,
records it and is scaled to zero; then `trainhook status` says Succeeded with the record (rank, pod, attempt) and
the gang's real shape (never `worker=0`), `trainhook list` lists it,
`trainhook logs -f` (started while the pods exist: the scale to zero deletes them, and their logs) showed both
pods' output, and the SDK's `TrainingClient.wait_for_job` returns the succeeded state."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from e2e_gangs import NAMESPACE, delete_gang, pods_of, statefulset, statefulset_gang
from e2e_helpers import REPO, wait_for

NAME = "e2e-done"
COMMAND = ["python", "-c", "import time; time.sleep(4); print('done')"]
TRAINHOOK = str(REPO / ".venv" / "bin" / "trainhook")


def trainhook(node, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([TRAINHOOK, *args, "-n", NAMESPACE, "--kubeconfig", node.node.kubeconfig],
                          capture_output=True, text=True, timeout=timeout, env=node.env)


def test_status_list_logs_and_the_sdk_on_a_finished_gang(node, release):
    from trainhook import TrainingClient

    assert Path(TRAINHOOK).exists(), TRAINHOOK
    delete_gang(node, NAME)
    follow = None
    t0 = time.monotonic()
    try:
        node.apply(NAMESPACE, statefulset_gang(NAME, node.images["torch"], COMMAND, 2))
        wait_for(lambda: len(pods_of(node, NAME)) == 2, 60, "the gang's 2 pods to be created", interval=0.2)
        follow = subprocess.Popen([TRAINHOOK, "logs", "-f", NAME, "-n", NAMESPACE, "--kubeconfig",
                                   node.node.kubeconfig], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env=node.env)

        client = TrainingClient(config_file=node.node.kubeconfig, namespace=NAMESPACE)
        state = client.wait_for_job(NAME, timeout=120, polling_interval=1)
        assert state.outcome == "Succeeded", state
        annotations = statefulset(node, NAME)["metadata"]["annotations"]
        assert annotations["trainhook.dev/phase"] == "Succeeded", annotations
        assert annotations["trainhook.dev/exit-code"] == "0", annotations

        # `logs -f` ends when the pods are deleted by the scale to zero.
        wait_for(lambda: statefulset(node, NAME)["spec"]["replicas"] == 0, 30, "the StatefulSet scaled to 0")
        wait_for(lambda: not pods_of(node, NAME), 60, "the gang's pods to be deleted by the scale to zero")
        out, err = follow.communicate(timeout=30)
        assert follow.returncode == 0, (out, err)
        for i in range(2):
            lines = [line for line in out.splitlines() if line.startswith(f"[{NAME}-{i}] ")]
            assert f"[{NAME}-{i}] done" in lines, (out, err)
            assert any("trainhook-launch run: gang succeeded" in line for line in lines), (out, err)

        status = trainhook(node, "status", NAME)
        assert status.returncode == 0, (status.stdout, status.stderr)
        print(status.stdout)
        assert "Succeeded" in status.stdout, status.stdout
        # the pods are gone: what the notary recorded with the outcome, and the shape the template keeps
        lines = status.stdout.splitlines()
        assert lines[0].startswith(f"gang {NAME} (pytorch, worker=2) in {NAMESPACE}: Succeeded"), status.stdout
        assert f"outcome: Succeeded, exit code 0, decided by rank 0 (pod {NAME}-0), attempt 1" in lines, lines
        assert "no pods yet" not in status.stdout and "worker=0" not in status.stdout, status.stdout
        assert client.get_job(NAME).shape == "worker=2"

        listed = trainhook(node, "list")
        assert listed.returncode == 0, (listed.stdout, listed.stderr)
        print(listed.stdout)
        (row,) = [line for line in listed.stdout.splitlines() if line.split()[:1] == [NAME]]
        assert "Succeeded" in row and row.split()[2] == "worker=2", listed.stdout
        print(f"status test took {time.monotonic() - t0:.1f}s")
    except BaseException:
        print(node.describe(NAMESPACE))
        raise
    finally:
        if follow is not None and follow.poll() is None:
            follow.kill()
            follow.communicate()
        delete_gang(node, NAME, wait=False)
