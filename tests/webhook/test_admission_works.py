"""What the webhook accepts, works (issue 25 item 5), over real HTTPS as the API server sends reviews.

Each of these was accepted at `kubectl apply` and failed later, where the user could not see why: a plain-string
`trainhook.dev/entrypoint` (exit 127 at run time), `nvidia.com/gpu: 500m` (every pod creation FailedCreate, nothing
on the workload), a pod template's own `trainhook.dev/replicas` (silently rewritten). And `trainhook convert` of a
job whose container has no command (manifests the webhook refuses), through the CLI's real parser and main.
"""

from __future__ import annotations

import base64
import json

import pytest
import yaml

from objects import bare_pod, container, indexed_job, pod_of_statefulset, review, statefulset
from test_server_https import admitted
from trainhook.gang import keys
from trainhook.cli import main

LAUNCHER = keys.LAUNCHER_COMMAND


def refusal(response: dict) -> str:
    assert response["allowed"] is False
    return response["status"]["message"]


def without_command() -> dict:
    return {k: v for k, v in container().items() if k != "command"}


# --- trainhook.dev/entrypoint: a JSON list of strings --------------------------------------------------------

def test_a_plain_string_entrypoint_is_refused_naming_the_list_to_write(webhook):
    sts = statefulset("ddp", 2, annotations={keys.ENTRYPOINT: "python -c 'print(1)'"}, containers=[without_command()])
    _, response = admitted(webhook, sts)
    assert refusal(response) == (
        "trainhook: trainhook.dev/entrypoint=\"python -c 'print(1)'\": not an entrypoint: a plain string, which "
        "would run as one program of that name; write the image's ENTRYPOINT as a JSON list of strings, e.g. "
        '["python", "-c", "print(1)"]')
    # Unused (the container has a command) or on a bare Pod: refused all the same, as the contract says.
    sts = statefulset("ddp", 2, annotations={keys.ENTRYPOINT: "python"})
    assert "trainhook.dev/entrypoint='python': not an entrypoint" in refusal(admitted(webhook, sts)[1])
    pod = bare_pod("p", {keys.JOB_NAME: "p", keys.INDEX: "0"}, {keys.REPLICAS: "worker=1", keys.ENTRYPOINT: "x y"})
    assert 'e.g. ["x", "y"]' in refusal(admitted(webhook, pod)[1])


def test_the_entrypoint_as_a_json_list_is_what_the_pod_runs_under_the_launcher(webhook):
    sts = statefulset("ddp", 2, annotations={keys.ENTRYPOINT: '["python", "-c", "print(1)"]'},
                      containers=[{**without_command(), "args": ["--lr", "0.1"]}])
    out, response = admitted(webhook, sts)
    assert response["allowed"] is True
    pod, _ = admitted(webhook, pod_of_statefulset(out, 0))
    trainer = pod["spec"]["containers"][0]
    assert trainer["command"] == [LAUNCHER, "run", "--", "python", "-c", "print(1)"]
    assert trainer["args"] == ["--lr", "0.1"]


# --- extended resources: whole devices, a request needs an equal limit ---------------------------------------

def with_resources(resources: dict, kind: str = "StatefulSet") -> dict:
    trainer = {**container(), "resources": resources}
    sidecar = {"name": "log", "image": "busybox", "resources": {"limits": {"cpu": "500m", "memory": "64Mi"}}}
    build = statefulset if kind == "StatefulSet" else indexed_job
    return build("ddp", 2, containers=[trainer, sidecar])


@pytest.mark.parametrize("resources, kind, expected", [
    ({"limits": {"nvidia.com/gpu": "500m"}}, "StatefulSet",
     "spec.template.spec.containers[trainer].resources.limits.nvidia.com/gpu='500m': an extended resource is a "
     "whole number of devices: the API server would refuse every pod (FailedCreate: must be an integer); use a "
     "whole number, e.g. 1"),
    ({"limits": {"nvidia.com/gpu": 0.5}, "requests": {"nvidia.com/gpu": 0.5}}, "Job",
     "spec.template.spec.containers[trainer].resources.limits.nvidia.com/gpu=0.5: an extended resource is a whole"),
    ({"limits": {"amd.com/gpu": "1.5"}}, "StatefulSet", "resources.limits.amd.com/gpu='1.5'"),
    ({"requests": {"nvidia.com/gpu": "1"}}, "StatefulSet",
     "spec.template.spec.containers[trainer].resources.requests.nvidia.com/gpu='1': an extended resource needs a "
     "limit (it is never overcommitted): the API server would refuse every pod; set resources.limits.nvidia.com/gpu"),
    ({"requests": {"nvidia.com/gpu": 1}, "limits": {"nvidia.com/gpu": 2}}, "Job",
     "resources.requests.nvidia.com/gpu=1: differs from the limit (2): the API server would refuse every pod"),
])
def test_an_extended_resource_that_no_pod_could_have_is_refused_at_the_workload_naming_the_field(
        webhook, resources, kind, expected):
    _, response = admitted(webhook, with_resources(resources, kind))
    assert expected in refusal(response)
    assert response["status"]["message"].count("nvidia.com/gpu") + response["status"]["message"].count(
        "amd.com/gpu") >= 1


@pytest.mark.parametrize("resources", [
    {"limits": {"nvidia.com/gpu": "1"}}, {"limits": {"nvidia.com/gpu": 2}, "requests": {"nvidia.com/gpu": "2"}},
    {"limits": {"nvidia.com/gpu": "1000m", "cpu": "1500m", "memory": "1.5Gi", "hugepages-2Mi": "1Mi"}},
    {"requests": {"cpu": "250m"}},
])
def test_whole_devices_and_fractional_native_resources_are_admitted(webhook, resources):
    out, response = admitted(webhook, with_resources(resources))
    assert response["allowed"] is True, response
    pod, response = admitted(webhook, pod_of_statefulset(out, 1))
    assert response["allowed"] is True


# --- trainhook.dev/replicas written on the pod template ------------------------------------------------------

def template_shape(sts: dict) -> str:
    return sts["spec"]["template"]["metadata"]["annotations"][keys.REPLICAS]


def test_a_templates_own_shape_that_disagrees_is_refused_at_create_never_rewritten_in_silence(webhook):
    sts = statefulset("ddp", 2, annotations=None)
    sts["spec"]["template"]["metadata"]["annotations"] = {keys.REPLICAS: "worker=4"}
    _, response = admitted(webhook, sts)
    assert refusal(response) == (
        "trainhook: trainhook.dev/replicas='worker=4': written on the pod template, it disagrees with the gang's "
        "shape worker=2 (from the workload's size and annotations): the webhook stamps trainhook.dev/replicas on the "
        "template itself; drop it from the template (set the size in the workload's spec.replicas/completions, a "
        "multi-role shape in the workload's own annotation), or make it worker=2")
    job = indexed_job("j", 3)
    job["spec"]["template"]["metadata"]["annotations"] = {keys.REPLICAS: "worker=1"}
    assert "trainhook.dev/replicas='worker=1': written on the pod template" in refusal(admitted(webhook, job)[1])
    # The same shape (ours, read back with kubectl get -o yaml; or a multi-role shape in any order): admitted.
    sts["spec"]["template"]["metadata"]["annotations"] = {keys.REPLICAS: "worker=2"}
    out, response = admitted(webhook, sts)
    assert response["allowed"] is True and "warnings" not in response
    multi = statefulset("g-worker", 3, labels={keys.JOB_NAME: "g", keys.ROLE: "worker"}, service="g")
    multi["spec"]["template"]["metadata"]["annotations"] = {keys.REPLICAS: "worker=3, master=1"}
    out, response = admitted(webhook, multi)
    assert response["allowed"] is True and "warnings" not in response and template_shape(out) == "master=1,worker=3"


def test_a_stopped_gangs_manifest_is_admitted_and_an_update_that_restamps_says_so(webhook):
    sts, _ = admitted(webhook, statefulset("ddp", 2))
    assert template_shape(sts) == "worker=2"
    stopped = json.loads(json.dumps(sts))
    stopped["spec"]["replicas"] = 0  # a finished gang, scaled to zero, read back and created again
    out, response = admitted(webhook, stopped)
    assert response["allowed"] is True
    assert response["warnings"] == ["spec.template.metadata.annotations[trainhook.dev/replicas]: 'worker=2' "
                                    "replaced by 'worker=0': the gang's shape follows the workload's size and "
                                    "annotations, and its pods restart with the new one"]
    resized = json.loads(json.dumps(sts))
    resized["spec"]["replicas"] = 3  # kubectl apply of a new size: our old stamp is replaced, visibly
    reply = webhook.post(review(resized, "UPDATE", old=sts)).json()["response"]
    assert reply["allowed"] is True
    assert reply["warnings"] == ["spec.template.metadata.annotations[trainhook.dev/replicas]: 'worker=2' replaced "
                                 "by 'worker=3': the gang's shape follows the workload's size and annotations, and "
                                 "its pods restart with the new one"]
    patch = json.loads(base64.b64decode(reply["patch"]))
    assert {"op": "replace", "path": "/spec/template/metadata/annotations/trainhook.dev~1replicas",
            "value": "worker=3"} in patch
    unchanged = webhook.post(review(sts, "UPDATE", old=sts)).json()["response"]  # e.g. the outcome's annotations
    assert unchanged["allowed"] is True and "warnings" not in unchanged and "patch" not in unchanged


# --- convert: a container without command ---------------------------------------------------------------------

def test_convert_refuses_a_job_without_command_and_takes_its_entrypoint_as_an_option(tmp_path, capsys):
    job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "mnist"},
           "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": {"spec": {"containers": [
               {"name": "pytorch", "image": "example.com/mnist:1", "args": ["--epochs", "1"]}]}}},
               "Worker": {"replicas": 2, "template": {"spec": {"containers": [
                   {"name": "pytorch", "image": "example.com/mnist:1", "args": ["--epochs", "1"]}]}}}}}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    assert main(["convert", str(path)]) == 1  # it exited 0 with manifests the webhook refuses
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(
        "error: PyTorchJob/mnist: spec.pytorchReplicaSpecs.Master: container pytorch and "
        "spec.pytorchReplicaSpecs.Worker: container pytorch have no command: it would run its image's ENTRYPOINT")
    assert "give the image's entrypoint with --entrypoint" in captured.err
    assert main(["convert", str(path), "--entrypoint", "python /app/mnist.py"]) == 1
    assert capsys.readouterr().err == (
        "error: --entrypoint 'python /app/mnist.py': not an entrypoint: a plain string, which would run as one "
        'program of that name; write the image\'s ENTRYPOINT as a JSON list of strings, e.g. ["python", '
        '"/app/mnist.py"]\n')
    out = tmp_path / "out.yaml"
    assert main(["convert", str(path), "--entrypoint", '["python", "/app/mnist.py"]', "-o", str(out)]) == 0
    capsys.readouterr()
    workloads = [d for d in yaml.safe_load_all(out.read_text()) if d["kind"] == "StatefulSet"]
    assert [w["spec"]["template"]["spec"]["containers"][0]["command"] for w in workloads] == \
        [["python", "/app/mnist.py"]] * 2
    assert main(["explain", str(out)]) == 0  # the webhook's own code admits every pod
    pods = capsys.readouterr().out
    assert pods.count("# pod mnist-") == 3
