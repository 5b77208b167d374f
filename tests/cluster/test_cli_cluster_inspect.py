"""A finished gang whose pods are gone, inspected through a real API server with the real webhook: `status`,
`list`, `logs` (with and without -f) and the SDK's `get_job`/`get_job_logs` (issue 25 item 2).

The control plane has no kubelet, so no container ever runs: the gang's end is played by writing what the notary
writes (its own record_patch on the StatefulSet, then the scale to zero, whose pod deletions the real StatefulSet
controller makes). What the CLI and SDK then show comes from the objects as the API server returns them."""

from __future__ import annotations

import re

import threading
import time

import pytest

from test_cli_cluster import cli, wait_for
from trainhook import TrainingClient
from trainhook.cli import main
from trainhook.webhook.notary.records import parse_outcome, record_patch

pytestmark = pytest.mark.cluster
LINES_1 = "epoch 1 loss 0.9\nTraceback (most recent call last):\nValueError: bad batch 7"
OUTCOME = {"phase": "Failed", "code": 3, "reason": "rank 1 (worker-1 at fin-1.fin) exited with 3", "rank": 1,
           "time": "2025-01-01T00:10:00Z", "attempt": 1, "started": "2025-01-01T00:00:00Z",
           "logs": {"1": LINES_1, "0": "epoch 1 loss 0.9"}}


def finish(api, namespace: str) -> None:
    """What the notary does when the coordinator records OUTCOME: the record on the workload, then the scale to 0."""
    from kubernetes import client

    apps = client.AppsV1Api(api)
    outcome = {**parse_outcome({"outcome": OUTCOME}), "pod": "fin-1", "pods": {0: "fin-0", 1: "fin-1"}}
    apps.patch_namespaced_stateful_set("fin", namespace, record_patch(outcome))
    apps.patch_namespaced_stateful_set_scale("fin", namespace, {"spec": {"replicas": 0}})


def test_a_finished_gang_without_pods_shows_its_record_shape_and_kept_lines(
        control_plane, k8s_namespace, mutating_webhook, capsys):
    kube = ["--kubeconfig", str(control_plane.kubeconfig), "-n", k8s_namespace]
    code, _, err = cli(capsys, "submit", "fin", "--workers", "2", "--image", "example.com/train:1", *kube, "--",
                       "python", "/train.py")
    assert code == 0, err
    wait_for(lambda: cli(capsys, "status", "fin", *kube)[1].count("Pending") >= 2, what="two pods")

    # `logs -f` started while the pods exist and have not started: the gang ends before any of them ever ran.
    following: dict = {}

    def follow() -> None:
        following["code"] = main(["logs", "fin", "-f", *kube])

    thread = threading.Thread(target=follow)
    thread.start()
    time.sleep(2)
    assert thread.is_alive()
    with control_plane.api_client() as api:
        finish(api, k8s_namespace)
    thread.join(90)
    assert not thread.is_alive() and following["code"] == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == ["[fin-0] epoch 1 loss 0.9"] + [f"[fin-1] {line}" for line in LINES_1.splitlines()]
    assert "[fin-1] (its pod is gone: the last 3 lines of rank 1, kept with the gang's outcome)" in err

    wait_for(lambda: "no pods:" in cli(capsys, "status", "fin", *kube)[1], 60, "the pods to be deleted")
    code, out, _ = cli(capsys, "status", "fin", *kube)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith(f"gang fin (pytorch, worker=2) in {k8s_namespace}: Failed")
    assert "outcome: Failed, exit code 3, decided by rank 1 (pod fin-1), attempt 1" in lines
    assert "started: 2025-01-01T00:00:00Z  ended: 2025-01-01T00:10:00Z" in lines
    assert "no pods yet" not in out and "worker=0" not in out

    code, out, _ = cli(capsys, "list", *kube)
    (row,) = [line.split() for line in out.splitlines() if line.startswith("fin ")]
    assert row[:7] == ["fin", "pytorch", "worker=2", "0/2", "0", "Failed", "-"], row
    assert all(re.fullmatch(r"-|\d+[smhd](\d+[smh])?", cell) for cell in row[7:]) and len(row) == 9, row

    code, out, err = cli(capsys, "logs", "fin", *kube)
    assert code == 0, err
    assert out.splitlines()[-1] == "[fin-1] ValueError: bad batch 7"
    assert "kept with the gang's outcome" in err

    with TrainingClient(config_file=str(control_plane.kubeconfig), namespace=k8s_namespace) as sdk:
        state = sdk.get_job("fin")
        assert (state.outcome, state.shape, state.recorded.pod, state.recorded.rank) == ("Failed", "worker=2",
                                                                                          "fin-1", 1)
        expected = {"fin-0": "epoch 1 loss 0.9\n", "fin-1": LINES_1 + "\n"}
        assert sdk.get_job_logs("fin") == expected
        assert sdk.get_job_logs("fin", follow=True) == expected
        assert [s.shape for s in sdk.list_jobs() if s.name == "fin"] == ["worker=2"]
    assert cli(capsys, "delete", "fin", *kube)[0] == 0
