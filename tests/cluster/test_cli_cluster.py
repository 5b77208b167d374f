"""`trainhook submit/status/list/logs/delete` against a real Kubernetes API server with the real webhook.

The control plane has no kubelet, so pods stay Pending: enough to see the webhook's ranks in `status`, the
gang in `list`, `submit --wait` report progress and time out, and `delete` remove everything.
"""

from __future__ import annotations

import re

import threading
import time
from pathlib import Path

import pytest
import yaml

from launcher_outcomes import decided, record
from trainhook.gang import keys
from trainhook.cli import main

pytestmark = pytest.mark.cluster
ROOT = Path(__file__).resolve().parents[2]


def wait_for(condition, timeout: float = 30, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.3)
    raise TimeoutError(f"{what} not met after {timeout}s")


def cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_submit_status_list_logs_delete_a_gang(control_plane, k8s_namespace, mutating_webhook, capsys):
    kube = ["--kubeconfig", str(control_plane.kubeconfig), "-n", k8s_namespace]
    code, out, err = cli(capsys, "submit", "mnist", "--role", "master=1", "--workers", "2", "--image",
                         "example.com/train:1", "--gpus", "1", *kube, "--", "torchrun", "/workspace/train.py")
    assert code == 0, err
    assert out.splitlines() == ["service/mnist created", "statefulset/mnist-master created",
                                "statefulset/mnist-worker created"]

    def three_pods():
        code, out, _ = cli(capsys, "status", "mnist", *kube)
        rows = [line for line in out.splitlines() if line.startswith("mnist-")]
        return out if code == 0 and len(rows) == 3 else None

    status = wait_for(three_pods, what="three pods").splitlines()
    assert status[0] == f"gang mnist (pytorch, master=1,worker=2) in {k8s_namespace}: Pending (3/3 pods created)"
    assert status[1] == "workloads: statefulset/mnist-master, statefulset/mnist-worker"
    rows = [line.split() for line in status[3:]]
    # the ranks are the webhook's (TRAINHOOK_RANK), master first
    assert [(r[0], r[1], r[2], r[3], r[5]) for r in rows] == [
        ("mnist-master-0", "master", "0", "Pending", "0"), ("mnist-worker-0", "worker", "1", "Pending", "0"),
        ("mnist-worker-1", "worker", "2", "Pending", "0")]

    code, out, _ = cli(capsys, "list", *kube)
    assert code == 0
    assert out.split("\n")[0].split() == ["NAME", "FRAMEWORK", "SHAPE", "PODS", "RESTARTS", "OUTCOME", "PROGRESS",
                                         "DURATION", "AGE"]
    row = out.split("\n")[1].split()
    assert row[:7] == ["mnist", "pytorch", "master=1,worker=2", "0/3", "0", "Pending", "-"], row
    assert all(re.fullmatch(r"-|\d+[smhd](\d+[smh])?", cell) for cell in row[7:]) and len(row) == 9, row

    code, out, err = cli(capsys, "logs", "mnist", *kube)
    assert code == 0 and out == ""
    assert "[mnist-master-0] (no log yet: pytorch has not started)" in err

    following = {}  # logs -f waits for every pod to start, and ends when they are deleted unstarted
    thread = threading.Thread(target=lambda: following.setdefault("code", main(["logs", "mnist", "-f", *kube])))
    thread.start()
    time.sleep(2)
    assert thread.is_alive()

    code, out, err = cli(capsys, "delete", "mnist", *kube)
    assert code == 0, err
    assert out.splitlines() == ["statefulset/mnist-master deleted", "statefulset/mnist-worker deleted",
                                "service/mnist deleted"]
    thread.join(60)
    assert not thread.is_alive() and following["code"] == 0
    wait_for(lambda: cli(capsys, "status", "mnist", *kube)[0] == 1, what="the gang to be gone")
    assert cli(capsys, "status", "mnist", *kube)[1].strip() == f"gang mnist not found in namespace {k8s_namespace}"


def template_labeled_tf_gang() -> list[dict]:
    """A TensorFlow chief/ps/worker gang whose job-name and role labels are on the pod templates only."""
    docs = [{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "tfjob", "labels": {keys.JOB_NAME: "tfjob"}},
             "spec": {"selector": {keys.JOB_NAME: "tfjob"}, "ports": [{"port": 2222}]}}]
    for role, count in (("chief", 1), ("ps", 1), ("worker", 2)):
        labels = {"app": f"tfjob-{role}", keys.FRAMEWORK: "tensorflow", keys.JOB_NAME: "tfjob", keys.ROLE: role}
        docs.append({"apiVersion": "apps/v1", "kind": "StatefulSet",
                     "metadata": {"name": f"tfjob-{role}", "labels": {keys.FRAMEWORK: "tensorflow"}},
                     "spec": {"replicas": count, "serviceName": "tfjob",
                              "selector": {"matchLabels": {"app": f"tfjob-{role}"}},
                              "template": {"metadata": {"labels": labels,
                                                        "annotations": {keys.REPLICAS: "chief=1,ps=1,worker=2"}},
                                           "spec": {"containers": [{"name": "tf", "image": "tf:1",
                                                                    "command": ["python", "/t.py"]}]}}}})
    return docs


def test_a_gang_labeled_on_its_templates_only_is_one_gang_to_list_status_and_delete(
        control_plane, k8s_namespace, mutating_webhook, capsys, tmp_path):
    kube = ["--kubeconfig", str(control_plane.kubeconfig), "-n", k8s_namespace]
    manifest = tmp_path / "tfjob.yaml"
    manifest.write_text(yaml.safe_dump_all(template_labeled_tf_gang()))
    code, out, err = cli(capsys, "submit", "-f", str(manifest), *kube)
    assert code == 0, err
    code, out, _ = cli(capsys, "list", *kube)
    assert [line.split()[:3] for line in out.splitlines()[1:]] == [["tfjob", "tensorflow", "chief=1,ps=1,worker=2"]]
    wait_for(lambda: len([line for line in cli(capsys, "status", "tfjob", *kube)[1].splitlines()
                          if line.startswith("tfjob-")]) == 4, what="four pods")
    code, out, _ = cli(capsys, "status", "tfjob", *kube)
    assert "workloads: statefulset/tfjob-chief, statefulset/tfjob-ps, statefulset/tfjob-worker" in out
    code, out, err = cli(capsys, "delete", "tfjob", *kube)
    assert code == 0, err
    assert out.splitlines() == ["statefulset/tfjob-chief deleted", "statefulset/tfjob-ps deleted",
                                "statefulset/tfjob-worker deleted", "service/tfjob deleted"]


def test_submit_wait_shows_progress_and_times_out(control_plane, k8s_namespace, mutating_webhook, capsys,
                                                  monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(control_plane.kubeconfig))  # the kubeconfig found the way kubectl does
    manifest = ROOT / "examples" / "pytorch" / "ddp.yaml"
    code, out, err = cli(capsys, "submit", "-f", str(manifest), "-n", k8s_namespace, "--wait", "--timeout", "8",
                         "--interval", "0.5")
    assert code == 124, out + err
    lines = out.splitlines()
    assert lines[:3] == ["service/ddp created", "configmap/ddp-script created", "statefulset/ddp created"]
    progress = [line.split(" ", 1)[1] for line in lines[3:]]  # without the time stamps
    assert "gang ddp: Pending (4 Pending; 0 restarts)" in progress
    assert "  pod ddp-3 (rank 3): Pending" in progress
    assert "still Pending after 8s" in err


def test_the_recorded_phase_is_the_outcome(control_plane, k8s_namespace, mutating_webhook, capsys):
    kube = ["--kubeconfig", str(control_plane.kubeconfig), "-n", k8s_namespace]
    assert cli(capsys, "submit", "done", "--workers", "1", "--image", "i", *kube, "--", "true")[0] == 0
    code, _, err = cli(capsys, "submit", "done", "--workers", "1", "--image", "i", *kube, "--", "true")
    assert code == 1  # submit creates; the API server's own words say why it cannot
    assert err == 'Error from server (AlreadyExists): service/done: services "done" already exists\n'
    outcome = decided("done", size=1)
    with control_plane.api_client() as api:  # recorded by the launcher's own writer, as rank 0 records it
        record(api, "StatefulSet", "done", k8s_namespace, outcome)
    code, out, _ = cli(capsys, "status", "done", *kube)
    assert out.splitlines()[0].endswith(f": Succeeded (rank 0 (worker-0 at done-0.done) exited 0 (exit 0) at "
                                        f"{outcome.time})")
    code, out, _ = cli(capsys, "submit", "-f", "/dev/null", *kube)  # nothing to create is an error, not a hang
    assert code == 1


def test_a_refused_manifest_creates_nothing(control_plane, k8s_namespace, mutating_webhook, capsys,
                                            tmp_path):
    from kubernetes import client

    manifest = tmp_path / "broken.yaml"
    manifest.write_text(yaml.safe_dump_all([
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "broken", "labels": {keys.JOB_NAME: "broken"}},
         "spec": {"selector": {keys.JOB_NAME: "broken"}}},
        {"apiVersion": "apps/v1", "kind": "StatefulSet",
         "metadata": {"name": "broken", "labels": {keys.FRAMEWORK: "pytorch"}},
         "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "broken"}},
                  "template": {"metadata": {"labels": {"app": "broken", keys.FRAMEWORK: "pytorch"}},
                               "spec": {"containers": [{"name": "t", "image": "i"}]}}}}]))
    code, out, err = cli(capsys, "submit", "-f", str(manifest), "-n", k8s_namespace, "--kubeconfig",
                         str(control_plane.kubeconfig))
    assert code == 1 and out == ""
    assert err.startswith(f'Error from server (Forbidden): error when creating "{manifest}": admission webhook '
                          f'"workloads.trainhook.dev" denied the request: trainhook: spec.serviceName=None')
    with control_plane.api_client() as api:
        assert client.CoreV1Api(api).list_namespaced_service(k8s_namespace).items == []


def test_a_missing_kubeconfig_is_named(capsys, tmp_path):
    code, _, err = cli(capsys, "status", "x", "--kubeconfig", str(tmp_path / "nope"))
    assert code == 1
    assert f"cannot load kubeconfig {tmp_path / 'nope'}" in err
