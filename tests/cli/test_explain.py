"""`trainhook explain`: offline, the webhook's own code shows what every pod of a manifest would get."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import yaml

from trainhook.gang import keys
from trainhook.cli import main
from trainhook.render.explain import explain_text
from trainhook.local.admission import build_review
from trainhook.local.controllers import ADMIN_USER

ROOT = Path(__file__).resolve().parents[2]
DDP = ROOT / "examples" / "pytorch" / "ddp.yaml"

BROKEN = """\
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: broken
  labels: {trainhook.dev/framework: pytorch}
spec:
  replicas: 2
  selector: {matchLabels: {app: broken}}
  template:
    metadata:
      labels: {app: broken, trainhook.dev/framework: pytorch, trainhook.dev/role: boss}
    spec:
      containers: [{name: t, image: i}]
"""


def blocks(text: str) -> dict[str, dict[str, str]]:
    """`# pod NAME (container C)` blocks of `NAME=VALUE` lines, by pod name."""
    found: dict[str, dict[str, str]] = {}
    for block in text.strip().split("\n\n"):
        head, *lines = block.splitlines()
        assert head.startswith("# pod ")
        found[head.split()[2]] = dict(line.split("=", 1) for line in lines)
    return found


def test_every_pod_of_the_ddp_example_and_its_environment(capsys):
    assert main(["explain", str(DDP)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "# pod ddp-0 (container trainer)"
    pods = blocks(out)
    assert list(pods) == ["ddp-0", "ddp-1", "ddp-2", "ddp-3"]
    for rank, env in enumerate(pods.values()):
        assert env["RANK"] == env["PET_NODE_RANK"] == env[keys.TH_RANK] == str(rank)
        assert env["WORLD_SIZE"] == "4"
        assert env["MASTER_ADDR"] == "ddp-0.ddp"
        assert env[keys.TH_ADDRESS] == f"ddp-{rank}.ddp"
        assert "EPOCHS" not in env  # the user's own variables are not the webhook's
    assert list(pods["ddp-0"])[:3] == ["MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE"]  # injected order


def test_yaml_output_is_the_mutated_pods(capsys):
    assert main(["explain", str(DDP), "-o", "yaml", "-n", "team-a", "--launcher-image", "registry.example/l:2"]) == 0
    pods = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [p["metadata"]["name"] for p in pods] == ["ddp-0", "ddp-1", "ddp-2", "ddp-3"]
    for pod in pods:
        kubernetes_validate.validate(pod, "1.33.0", strict=True)
        assert pod["metadata"]["namespace"] == "team-a"
        init = pod["spec"]["initContainers"][0]
        assert (init["name"], init["image"]) == (keys.GANG_WAIT_CONTAINER, "registry.example/l:2")
        assert pod["spec"]["hostname"] == pod["metadata"]["name"] and pod["spec"]["subdomain"] == "ddp"


def test_indexed_job_pods_are_named_as_the_job_controller_names_them(capsys):
    manifest = ROOT / "examples" / "tensorflow" / "mirrored.yaml"
    assert main(["explain", str(manifest)]) == 0
    pods = blocks(capsys.readouterr().out)
    assert list(pods) == ["mirrored-0-*", "mirrored-1-*"]
    assert json.loads(pods["mirrored-1-*"]["TF_CONFIG"])["task"] == {"type": "worker", "index": 1}


def test_a_refusal_is_the_webhooks_own_message_and_exit_1(tmp_path, capsys, webhook):
    path = tmp_path / "broken.yaml"
    path.write_text(BROKEN)
    assert main(["explain", str(path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    # what the real webhook server answers for the same StatefulSet, as kubectl would print it
    obj = yaml.safe_load(BROKEN)
    obj["metadata"]["namespace"] = "default"
    answer = webhook.post(build_review(obj, ADMIN_USER)).json()["response"]
    assert answer["allowed"] is False
    assert captured.err == (f'Error from server (Forbidden): error when creating "{path}": admission webhook '
                            f'"workloads.trainhook.dev" denied the request: {answer["status"]["message"]}\n')
    # both problems in one answer: the template's role is read as the workload's own would be
    assert "trainhook: trainhook.dev/role='boss': not a pytorch role" in captured.err
    assert "; spec.serviceName=None: peers resolve each other through it" in captured.err


def test_a_pod_the_controller_could_not_create_is_named(tmp_path, capsys):
    manifest = yaml.safe_load(BROKEN)
    manifest["spec"]["serviceName"] = "broken"
    manifest["spec"]["template"]["metadata"]["labels"][keys.ROLE] = "worker"
    manifest["spec"]["template"]["metadata"]["annotations"] = {keys.CONTAINER: "missing"}
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(manifest))
    assert main(["explain", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith('statefulset/broken could not create broken-0: admission webhook "workloads.trainhook.dev" '
                          "denied the request: trainhook: trainhook.dev/container='missing'")


def test_the_webhooks_warnings_go_to_stderr_and_user_variables_are_kept(tmp_path, capsys):
    manifest = yaml.safe_load(DDP.read_text().split("---")[-1])
    manifest["spec"]["template"]["spec"]["containers"][0]["env"].append({"name": "WORLD_SIZE", "value": "99"})
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump_all([manifest, {"apiVersion": "apps/v1", "kind": "Deployment",
                                                   "metadata": {"name": "web"}, "spec": {}}]))
    assert main(["explain", str(path)]) == 0
    captured = capsys.readouterr()
    assert "WORLD_SIZE" not in blocks(captured.out)["ddp-0"]
    assert "Warning: pod/ddp-0: container trainer: kept your WORLD_SIZE=99; trainhook would set 4" in captured.err
    assert "Warning: not explained (no pods of trainhook's): Deployment/web (apps/v1)" in captured.err


def test_explain_reads_standard_input_and_names_bad_yaml_by_line_and_column():
    ok = subprocess.run([sys.executable, "-m", "trainhook.cli", "explain", "-"], input=DDP.read_text(),
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and ok.stdout.startswith("# pod ddp-0 ")
    bad = subprocess.run([sys.executable, "-m", "trainhook.cli", "explain", "-"],
                         input="apiVersion: v1\nkind: Pod\nmetadata:\n  name: x: y\n",
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1
    assert bad.stderr == "error: <stdin>:4:10: invalid YAML: mapping values are not allowed here\n"


def test_explain_text_is_a_library_call():
    explained = explain_text(DDP.read_text(), "ddp.yaml", namespace="ns")
    assert [dict(p.injected)[keys.TH_NAMESPACE] for p in explained.pods] == ["ns"] * 4
