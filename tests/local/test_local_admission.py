"""trainhook local: reviews sent to the real webhook server, as kube-apiserver sends them."""

from __future__ import annotations

import base64
import json
import os
import random
import socket

import pytest

from trainhook.gang import keys
from trainhook.local import admission
from trainhook.local.admission import AdmissionError, Denied, WebhookServer, apply_response, build_review
from trainhook.local.controllers import ADMIN_USER, controller_user, job_pods, statefulset_pods, store
from trainhook.local.manifest import parse_manifest
from trainhook.local.run import admit_manifest

STS = {"apiVersion": "apps/v1", "kind": "StatefulSet",
       "metadata": {"name": "ddp", "namespace": "ml", "labels": {keys.FRAMEWORK: "pytorch"}},
       "spec": {"serviceName": "ddp", "replicas": 2,
                "template": {"metadata": {"labels": {keys.FRAMEWORK: "pytorch"}},
                             "spec": {"containers": [{"name": "t", "image": "x", "command": ["run"]}]}}}}


@pytest.fixture(scope="module")
def webhook(tmp_path_factory):
    with WebhookServer(tmp_path_factory.mktemp("webhook")) as server:
        yield server


def test_reviews_carry_what_the_apiserver_sends():
    review = build_review(STS, ADMIN_USER, uid="u-1")
    assert review["apiVersion"] == "admission.k8s.io/v1" and review["kind"] == "AdmissionReview"
    request = review["request"]
    assert request["uid"] == "u-1"
    assert request["kind"] == {"group": "apps", "version": "v1", "kind": "StatefulSet"}
    assert request["resource"] == {"group": "apps", "version": "v1", "resource": "statefulsets"}
    assert (request["name"], request["namespace"], request["operation"]) == ("ddp", "ml", "CREATE")
    assert request["oldObject"] is None and request["dryRun"] is False
    assert request["userInfo"] == ADMIN_USER and request["object"] == STS
    assert request["object"] is not STS


def test_a_pod_made_from_generate_name_is_reviewed_without_a_name():
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": "ml"},
           "spec": {"completionMode": "Indexed", "completions": 1, "template": STS["spec"]["template"]}}
    request = build_review(job_pods(job)[0], ADMIN_USER)["request"]
    assert "name" not in request
    assert request["resource"] == {"group": "", "version": "v1", "resource": "pods"}
    assert request["kind"] == {"group": "", "version": "v1", "kind": "Pod"}


def answer_for(review, **response):
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "response": {"uid": review["request"]["uid"], **response}}


def test_answers_are_checked_as_the_apiserver_checks_them():
    review = build_review(STS, ADMIN_USER)
    patch = base64.b64encode(json.dumps([{"op": "add", "path": "/metadata/annotations", "value": {"a": "b"}}])
                             .encode()).decode()
    admitted = apply_response(STS, review, answer_for(review, allowed=True, patchType="JSONPatch", patch=patch,
                                                      warnings=["careful"]))
    assert admitted.obj["metadata"]["annotations"] == {"a": "b"} and admitted.warnings == ["careful"]
    assert "annotations" not in STS["metadata"]
    with pytest.raises(AdmissionError, match="expected response.uid"):
        apply_response(STS, review, {**answer_for(review, allowed=True), "response": {"uid": "other", "allowed": True}})
    with pytest.raises(Denied, match=r"Error from server \(Forbidden\): error when creating \"f.yaml\": "
                                     r"admission webhook denied the request: no"):
        apply_response(STS, review, answer_for(review, allowed=False, status={"message": "no"}), "f.yaml")
    with pytest.raises(AdmissionError, match="does not apply"):
        bad = base64.b64encode(b'[{"op": "remove", "path": "/nope"}]').decode()
        apply_response(STS, review, answer_for(review, allowed=True, patchType="JSONPatch", patch=bad))


def test_the_real_webhook_mutates_a_labeled_statefulset_and_its_pods(webhook):
    client = webhook.client()
    stored = store(client.admit(STS, ADMIN_USER).obj)
    assert stored["spec"]["podManagementPolicy"] == "Parallel"
    assert stored["spec"]["template"]["metadata"]["annotations"][keys.REPLICAS] == "worker=2"
    # as on a cluster: the StatefulSet controller creates the pod (its creator is checked: provenance.py)
    pod = client.admit(statefulset_pods(stored)[1], controller_user("statefulset-controller")).obj
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env[keys.TH_RANK] == "1" and env["MASTER_ADDR"] == "ddp-0.ddp"
    assert pod["spec"]["initContainers"][0]["name"] == keys.GANG_WAIT_CONTAINER


def test_the_real_webhook_leaves_unlabeled_objects_alone(webhook):
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "ml"},
           "spec": {"containers": [{"name": "c", "command": ["x"]}]}}
    admitted = webhook.client().admit(pod, ADMIN_USER)
    assert admitted.obj == pod and not admitted.patched


def test_a_denial_carries_the_webhooks_message(webhook):
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "lonely", "namespace": "ml", "labels": {keys.FRAMEWORK: "pytorch"}},
           "spec": {"containers": [{"name": "c", "command": ["x"]}]}}
    with pytest.raises(Denied) as denied:
        webhook.client("gang.yaml").admit(pod, ADMIN_USER)
    assert 'error when creating "gang.yaml"' in str(denied.value)
    assert keys.JOB_NAME in str(denied.value)


def test_admission_follows_the_clusters_order_and_names_job_pods(webhook):
    manifest = parse_manifest("""
apiVersion: batch/v1
kind: Job
metadata: {name: train, labels: {trainhook.dev/framework: pytorch}}
spec:
  completionMode: Indexed
  completions: 2
  parallelism: 2
  template:
    metadata: {labels: {trainhook.dev/framework: pytorch}}
    spec:
      subdomain: train
      restartPolicy: Never
      containers: [{name: t, command: [run], env: [{name: MASTER_PORT, value: "1234"}]}]
---
apiVersion: v1
kind: Service
metadata: {name: train, labels: {trainhook.dev/job-name: train}}
spec: {selector: {trainhook.dev/job-name: train}}
""")
    warnings = []
    state = admit_manifest(manifest, webhook.client(), warnings.append, random.Random(3))
    assert state.services[0]["spec"]["clusterIP"] == "None"
    names = [p["metadata"]["name"] for p in state.pods]
    assert [n[:-5] for n in names] == ["train-0-", "train-1-"] and len(set(names)) == 2
    assert [p["spec"]["hostname"] for p in state.pods] == ["train-0", "train-1"]
    assert any("MASTER_PORT" in w for w in warnings)  # the webhook's "kept your MASTER_PORT" warning


def test_a_webhook_that_cannot_start_is_reported_with_its_log(tmp_path):
    env = dict(os.environ, PYTHONHOME="/nonexistent")  # the interpreter cannot even start
    with pytest.raises(AdmissionError, match="exited with .* before it was ready"):
        with WebhookServer(tmp_path, env, startup_timeout=20):
            pass


def test_a_port_taken_between_its_choice_and_the_servers_bind_is_chosen_again(tmp_path, monkeypatch):
    """free_port finds a port free at that moment; another process may bind it before the webhook does (a CI
    run's paddle test lost its run to that once). The server then exits with EADDRINUSE and the ports are chosen
    again."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    ports = iter([taken.getsockname()[1]])
    real = admission.free_port
    monkeypatch.setattr(admission, "free_port", lambda: next(ports, None) or real())
    try:
        with WebhookServer(tmp_path, dict(os.environ), startup_timeout=20) as webhook:
            assert webhook.port != taken.getsockname()[1]  # and it became healthy on the port chosen again
    finally:
        taken.close()
