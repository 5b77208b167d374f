"""The other frameworks' examples train on the node, each on an image with Python and the framework only:

- examples/tensorflow/ps.yaml: a ParameterServerStrategy gang (a chief, 2 parameter servers, 2 workers) whose
  variables live on the parameter servers and whose steps run on the workers, over gRPC between pods, found
  through TF_CONFIG's stable names and the cluster DNS;
- examples/xgboost/xgboost_dist.yaml: XGBoost's collective (the master runs the tracker) across 3 pods, every
  worker ending with the same model.

The examples' manifests run as written but for their image, 100m CPU per pod (2 cores) and, for ps.yaml, one
StatefulSet per role instead of one Indexed Job per role: v1.20 has no Indexed Jobs (e2e_gangs.for_the_node).
The gang is one gang across its workloads either way: its outcome is recorded on every role's StatefulSet and
each is scaled to zero, so nothing retrains.
"""

from __future__ import annotations

import re

from e2e_gangs import (NAMESPACE, apply_gang, delete_documents, example_documents, for_the_node, phase_of,
                       statefulset)
from e2e_helpers import LogFollower, REPO, shown_on_failure, wait_for


def run_to_success(node, documents: list[dict], followed: list[str], timeout: float) -> dict[str, str]:
    """Apply a gang, follow the named pods' training containers, wait until every StatefulSet records Succeeded
    and is scaled to zero; the followed logs."""
    names = [d["metadata"]["name"] for d in documents if d["kind"] == "StatefulSet"]
    containers = {d["metadata"]["name"]: d["spec"]["template"]["spec"]["containers"][0]["name"]
                  for d in documents if d["kind"] == "StatefulSet"}
    followers: dict[str, LogFollower] = {}
    try:
        apply_gang(node, documents)
        for pod in followed:
            followers[pod] = LogFollower(node, NAMESPACE, pod, containers[pod.rsplit("-", 1)[0]])

        def succeeded():
            phases = {name: phase_of(node, name) for name in names}
            failed = {n: p for n, p in phases.items() if p.get("trainhook.dev/phase") == "Failed"}
            assert not failed, failed
            return all(p.get("trainhook.dev/phase") == "Succeeded" for p in phases.values()) and phases
        with shown_on_failure(node, NAMESPACE, followers):
            phases = wait_for(succeeded, timeout, f"the gang {names} to succeed", interval=2)
            wait_for(lambda: all(statefulset(node, n)["spec"]["replicas"] == 0 for n in names), 60,
                     "every role's StatefulSet scaled to zero")
        for name, phase in phases.items():
            assert phase["trainhook.dev/exit-code"] == "0", (name, phase)
        return {pod: f.text for pod, f in followers.items()}
    finally:
        for follower in followers.values():
            follower.stop()
        delete_documents(node, documents)


def test_a_tensorflow_parameter_server_gang_trains_across_five_pods(node, release):
    documents = for_the_node(example_documents(REPO / "examples" / "tensorflow" / "ps.yaml"),
                             node.images["tensorflow"])
    assert [d["metadata"]["name"] for d in documents if d["kind"] == "StatefulSet"] == [
        "ps-training-chief", "ps-training-ps", "ps-training-worker"]
    logs = run_to_success(node, documents, ["ps-training-chief-0", "ps-training-ps-1", "ps-training-worker-0"], 420)
    chief = logs["ps-training-chief-0"]
    assert "chief: coordinating 2 workers and 2 parameter servers" in chief, chief[-3000:]
    # The variables were placed on both parameter servers, by their stable names in TF_CONFIG.
    assert re.search(r"chief: variables on /job:ps/replica:0/task:0, /job:ps/replica:0/task:1", chief), chief[-3000:]
    losses = [float(x) for x in re.findall(r"chief: epoch \d loss ([0-9.]+)", chief)]
    assert len(losses) == 4 and losses[-1] < losses[0], chief[-3000:]
    assert chief.count("chief: coordinating") == 1  # trained once: no restart, no rerun
    ps = logs["ps-training-ps-1"]
    assert "ps-1: serving at grpc://" in ps and "ps-1: the chief has finished; exiting" in ps, ps[-3000:]
    worker = logs["ps-training-worker-0"]
    assert "worker-0: serving at grpc://" in worker, worker[-3000:]
    for text in logs.values():
        assert "trainhook-launch run: gang succeeded" in text, text[-2000:]


def test_an_xgboost_gang_trains_across_three_pods_to_the_same_model(node, release):
    documents = for_the_node(example_documents(REPO / "examples" / "xgboost" / "xgboost_dist.yaml"),
                             node.images["xgboost"])
    pods = ["xgb-master-0", "xgb-worker-0", "xgb-worker-1"]
    logs = run_to_success(node, documents, pods, 300)
    digests = {}
    for pod, text in logs.items():
        assert re.search(r"rank \d/3 on " + pod, text), (pod, text[-3000:])
        match = re.search(r"final model digest ([0-9a-f]+) identical-across-workers=True", text)
        assert match, (pod, text[-3000:])
        digests[pod] = match.group(1)
        assert text.count("final model digest") == 1, (pod, text[-3000:])
    assert len(set(digests.values())) == 1, digests
    assert {re.search(r"rank (\d)/3", logs[p]).group(1) for p in pods} == {"0", "1", "2"}
