"""`trainhook explain` and `submit -f` refuse a Deployment, ReplicaSet, DaemonSet or ReplicationController labeled for
training, naming it as an unsupported kind and the supported ones (issue 34); before, it was left out with a warning
and the rest explained, which read as accepted."""

from __future__ import annotations

import subprocess
import sys

import pytest

from trainhook.cli import main

SUPPORTED = "the supported kinds are StatefulSet, Job (Indexed), Pod, Service"
GANG = """\
apiVersion: v1
kind: Service
metadata: {name: ddp, labels: {trainhook.dev/job-name: ddp}}
spec: {clusterIP: None, selector: {trainhook.dev/job-name: ddp}}
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: ddp, labels: {trainhook.dev/framework: pytorch, trainhook.dev/job-name: ddp}}
spec:
  serviceName: ddp
  replicas: 2
  selector: {matchLabels: {trainhook.dev/job-name: ddp}}
  template:
    metadata: {labels: {trainhook.dev/framework: pytorch, trainhook.dev/job-name: ddp}}
    spec: {containers: [{name: pytorch, image: example.com/train:1, command: [python, /train.py]}]}
"""


def controller(kind: str, labeled: str, name: str = "train") -> str:
    """A `kind` whose pods run the training; trainhook.dev/framework on `labeled`: "it", "template" or ""."""
    own = "{trainhook.dev/framework: pytorch}" if labeled == "it" else "{app: train}"
    template = "{app: train, trainhook.dev/framework: pytorch}" if labeled == "template" else "{app: train}"
    api = "v1" if kind == "ReplicationController" else "apps/v1"
    selector = "{app: train}" if kind == "ReplicationController" else "{matchLabels: {app: train}}"
    return f"""\
apiVersion: {api}
kind: {kind}
metadata: {{name: {name}, labels: {own}}}
spec:
  selector: {selector}
  template:
    metadata: {{labels: {template}}}
    spec: {{containers: [{{name: pytorch, image: example.com/train:1, command: [python, /train.py]}}]}}
"""


def explain(tmp_path, capsys, text: str) -> tuple[int, str, str]:
    manifest = tmp_path / "train.yaml"
    manifest.write_text(text)
    code = main(["explain", str(manifest)])
    out, err = capsys.readouterr()
    return code, out, err.replace(str(tmp_path), "DIR")


@pytest.mark.parametrize("kind", ["Deployment", "ReplicaSet", "DaemonSet", "ReplicationController"])
def test_a_labeled_pod_controller_trainhook_does_not_wire_is_refused_by_kind(tmp_path, capsys, kind):
    code, out, err = explain(tmp_path, capsys, controller(kind, "it"))
    assert (code, out) == (1, "")
    assert err.startswith(f"error: DIR/train.yaml: {kind.lower()}/train: it is labeled trainhook.dev/framework, but "
                          f"{kind} is an unsupported kind: trainhook does not wire it")
    assert SUPPORTED in err


def test_a_label_on_the_pod_template_alone_is_refused_too(tmp_path, capsys):
    code, _, err = explain(tmp_path, capsys, controller("Deployment", "template"))
    assert code == 1
    assert "deployment/train: its pod template is labeled trainhook.dev/framework, but Deployment is an unsupported " \
           "kind" in err


def test_beside_a_real_gang_it_is_still_refused_not_left_out(tmp_path, capsys):
    code, out, err = explain(tmp_path, capsys, GANG + "---\n" + controller("DaemonSet", "it", "agent"))
    assert (code, out) == (1, "")
    assert "daemonset/agent: it is labeled" in err and SUPPORTED in err


def test_an_unlabeled_deployment_beside_a_gang_is_only_left_out(tmp_path, capsys):
    code, out, err = explain(tmp_path, capsys, GANG + "---\n" + controller("Deployment", ""))
    assert code == 0
    assert out.startswith("# pod ddp-0 (container pytorch)\n")
    assert err.strip() == "Warning: not explained (no pods of trainhook's): Deployment/train (apps/v1)"


def test_submit_refuses_it_before_creating_anything(tmp_path):
    """Run as the real CLI: the kubeconfig named does not exist, so the refusal came before any connection."""
    manifest = tmp_path / "train.yaml"
    manifest.write_text(GANG + "---\n" + controller("Deployment", "it"))
    result = subprocess.run([sys.executable, "-m", "trainhook.cli", "submit", "-f", str(manifest), "--kubeconfig",
                             str(tmp_path / "none")], capture_output=True, text=True, timeout=120)
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr.startswith(f"error: {manifest}: deployment/train: it is labeled trainhook.dev/framework")
    assert SUPPORTED in result.stderr and "Traceback" not in result.stderr
