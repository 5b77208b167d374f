"""The TensorFlow examples: manifests the real webhook admits into valid objects, and real TensorFlow training
on real network namespaces with `trainhook local` (root; TensorFlow installed, as `make install` does)."""

from __future__ import annotations

import base64
import copy
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import jsonpatch
import kubernetes_validate
import pytest
import yaml

from objects import pod_of_job, review
from helpers import local_failure, local_summary as summary

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "tensorflow"
MIRRORED, PS = EXAMPLES / "mirrored.yaml", EXAMPLES / "ps.yaml"
RECENT_KUBERNETES = "1.33.0"


def documents(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


@pytest.mark.parametrize("manifest,script", [(MIRRORED, "mirrored.py"), (PS, "ps.py")])
def test_the_configmap_carries_the_script_unchanged(manifest, script):
    """The .py file is the source; the ConfigMap that mounts it at /workspace on a cluster must be a copy."""
    config_maps = [doc for doc in documents(manifest) if doc["kind"] == "ConfigMap"]
    assert len(config_maps) == 1
    assert config_maps[0]["data"] == {script: (EXAMPLES / script).read_text()}


def admitted(webhook, obj: dict) -> dict:
    """The object after the webhook's patch, applied as the API server applies it."""
    reply = webhook.post(review(obj))
    assert reply.status_code == 200, reply.text
    response = reply.json()["response"]
    assert response["allowed"] is True, response
    if "patch" not in response:
        return copy.deepcopy(obj)
    return jsonpatch.JsonPatch(json.loads(base64.b64decode(response["patch"]))).apply(obj)


def test_the_parameter_server_gang_is_admitted_into_valid_objects_with_kubeflows_tf_config(webhook):
    docs = documents(PS)
    jobs = {doc["metadata"]["name"]: doc for doc in docs if doc["kind"] == "Job"}
    assert sorted(jobs) == ["ps-training-chief", "ps-training-ps", "ps-training-worker"]
    service = admitted(webhook, next(doc for doc in docs if doc["kind"] == "Service"))
    kubernetes_validate.validate(service, RECENT_KUBERNETES, strict=True)
    cluster = {"chief": ["ps-training-chief-0.ps-training:2222"],
               "ps": ["ps-training-ps-0.ps-training:2222", "ps-training-ps-1.ps-training:2222"],
               "worker": ["ps-training-worker-0.ps-training:2222", "ps-training-worker-1.ps-training:2222"]}
    for name, job in jobs.items():
        job["metadata"]["namespace"] = "default"
        job = admitted(webhook, job)
        kubernetes_validate.validate(job, RECENT_KUBERNETES, strict=True)
        role = name.rpartition("-")[2]
        for index in range(job["spec"]["completions"]):
            pod = admitted(webhook, pod_of_job(job, index))
            kubernetes_validate.validate(pod, RECENT_KUBERNETES, strict=True)
            assert (pod["spec"]["hostname"], pod["spec"]["subdomain"]) == (f"{name}-{index}", "ps-training")
            env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
            assert json.loads(env["TF_CONFIG"]) == {"cluster": cluster, "task": {"type": role, "index": index},
                                                    "environment": "cloud"}


def local(manifest: Path, tmp_path: Path, timeout: float = 420) -> subprocess.CompletedProcess:
    if importlib.util.find_spec("tensorflow") is None:
        pytest.fail("TensorFlow is not installed: the examples train with it (pip install tensorflow)")
    return subprocess.run([sys.executable, "-m", "trainhook.local.cli", str(manifest), "--timeout", str(timeout - 60),
                           "--workdir", str(tmp_path / "run")], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)




def test_the_mirrored_example_trains_two_workers_in_sync_to_equal_weights(tmp_path):
    result = local(MIRRORED, tmp_path)
    assert result.returncode == 0, local_failure(result)
    rows = summary(result.stdout)
    assert len(rows) == 2 and all(re.fullmatch(r"mirrored-[01]-\w{5}", pod) for pod in rows)
    assert sorted((row[0], row[1], row[3]) for row in rows.values()) == [("0", "0", "Completed"),
                                                                         ("1", "0", "Completed")]
    out = result.stdout
    assert sorted(re.findall(r"^\[mirrored-\d-\w{5}\] (worker-\d): num_replicas_in_sync=2$", out, re.M)) == [
        "worker-0", "worker-1"]
    digests = dict(re.findall(r"^\[mirrored-\d-\w{5}\] (worker-\d): final weights digest (\w+)$", out, re.M))
    assert sorted(digests) == ["worker-0", "worker-1"] and digests["worker-0"] == digests["worker-1"]
    losses = [float(x) for x in re.findall(r"^\[mirrored-0-\w{5}\] worker-0: epoch \d loss ([\d.]+)$", out, re.M)]
    assert len(losses) == 3 and losses[-1] < losses[0] / 4, losses


def test_the_parameter_server_example_trains_and_its_loss_falls(tmp_path):
    result = local(PS, tmp_path)
    assert result.returncode == 0, local_failure(result)
    rows = summary(result.stdout)
    roles = sorted(re.fullmatch(r"ps-training-(\w+)-\d-\w{5}", pod)[1] for pod in rows)
    assert roles == ["chief", "ps", "ps", "worker", "worker"]
    assert all(row[1:] and row[1] == "0" and row[3] == "Completed" for row in rows.values()), rows
    out = result.stdout
    assert re.search(r"^\[ps-training-chief-0-\w{5}\] chief: coordinating 2 workers and 2 parameter servers$",
                     out, re.M)
    assert re.search(r"chief: variables on /job:ps/replica:0/task:0, /job:ps/replica:0/task:1$", out, re.M)
    losses = [float(x) for x in re.findall(r"^\[ps-training-chief-0-\w{5}\] chief: epoch \d loss ([\d.]+)$",
                                           out, re.M)]
    assert len(losses) == 4 and losses[-1] < losses[0] / 4, losses
    assert len(re.findall(r"^\[ps-training-(?:ps|worker)-\d-\w{5}\] (?:ps|worker)-\d: the chief has finished; "
                          r"exiting$", out, re.M)) == 4
