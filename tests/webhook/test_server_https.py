"""The real server over HTTPS, with AdmissionReviews shaped like kube-apiserver's."""

from __future__ import annotations

import base64
import copy
import json
import ssl
import socket

import jsonpatch
import kubernetes_validate
import pytest
import yaml

from objects import bare_pod, indexed_job, pod_of_job, pod_of_statefulset, review, service, statefulset

RECENT_KUBERNETES = "1.33.0"


def admitted(webhook, obj: dict, operation: str = "CREATE") -> tuple[dict, dict]:
    """(mutated object, response) after the webhook's patch is applied, as the API server applies it."""
    sent = review(obj, operation)
    reply = webhook.post(sent)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["apiVersion"] == "admission.k8s.io/v1" and body["kind"] == "AdmissionReview"
    response = body["response"]
    assert response["uid"] == sent["request"]["uid"]
    if "patch" not in response:
        return copy.deepcopy(obj), response
    assert response["patchType"] == "JSONPatch"
    patch = jsonpatch.JsonPatch(json.loads(base64.b64decode(response["patch"])))
    return patch.apply(obj), response


def valid(obj: dict) -> None:
    kubernetes_validate.validate(obj, RECENT_KUBERNETES, strict=True)


def test_health_and_readiness_answer(webhook):
    import requests
    for path in ("/healthz", "/readyz"):
        assert requests.get(webhook.url + path, verify=str(webhook.ca_file), timeout=5).text == "ok"


def test_example_gang_is_mutated_into_valid_objects(webhook):
    docs = list(yaml.safe_load_all(open("examples/pytorch/ddp.yaml")))
    svc, sts = docs[0], docs[2]
    svc_out, _ = admitted(webhook, svc)
    assert svc_out["spec"]["clusterIP"] == "None" and svc_out["spec"]["publishNotReadyAddresses"] is True
    valid(svc_out)
    sts_out, _ = admitted(webhook, sts)
    assert sts_out["spec"]["podManagementPolicy"] == "Parallel"
    valid(sts_out)
    sts_out["metadata"]["namespace"] = "default"
    for ordinal in range(4):
        pod, response = admitted(webhook, pod_of_statefulset(sts_out, ordinal))
        assert response["allowed"] is True
        env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
        assert (env["RANK"], env["WORLD_SIZE"], env["MASTER_ADDR"]) == (str(ordinal), "4", "ddp-0.ddp")
        assert pod["spec"]["initContainers"][0]["image"] == "registry.example/launcher:1"
        valid(pod)


def test_indexed_job_and_bare_pods_are_valid_after_mutation(webhook):
    job, _ = admitted(webhook, indexed_job("ij", 2))
    valid(job)
    pod, _ = admitted(webhook, pod_of_job(job, 1))
    valid(pod)
    assert pod["spec"]["hostname"] == "ij-1"
    bare, _ = admitted(webhook, bare_pod("b", {"trainhook.dev/job-name": "b", "trainhook.dev/index": "0"},
                                         {"trainhook.dev/replicas": "worker=2"}))
    valid(bare)
    assert (bare["spec"]["hostname"], bare["spec"]["subdomain"]) == ("b-worker-0", "b")


def test_a_multi_role_gang_labeled_on_its_templates_only_is_wired_end_to_end(webhook):
    """A TensorFlow chief/ps/worker gang as many users write it: the framework alone on each StatefulSet, the
    job name, role and shape on the pod templates. Each StatefulSet is admitted, and its pods get the whole
    cluster in TF_CONFIG."""
    shape, cluster = "chief=1,ps=1,worker=2", {"chief": 1, "ps": 1, "worker": 2}
    svc, _ = admitted(webhook, service("tfjob"))
    valid(svc)
    rank = 0
    for role, count in cluster.items():
        sts = statefulset(f"tfjob-{role}", count, labels={"trainhook.dev/framework": "tensorflow"}, service="tfjob")
        meta = sts["spec"]["template"]["metadata"]
        meta["labels"].update({"trainhook.dev/job-name": "tfjob", "trainhook.dev/role": role})
        meta["annotations"] = {"trainhook.dev/replicas": shape}
        sts_out, response = admitted(webhook, sts)
        assert response["allowed"] is True, response.get("status")
        assert sts_out["spec"]["podManagementPolicy"] == "Parallel"
        assert sts_out["spec"]["template"] == sts["spec"]["template"]  # it already says all its pods need
        valid(sts_out)
        for index in range(count):
            pod, response = admitted(webhook, pod_of_statefulset(sts_out, index))
            assert response["allowed"] is True, response.get("status")
            valid(pod)
            env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
            assert json.loads(env["TF_CONFIG"]) == {
                "cluster": {r: [f"tfjob-{r}-{i}.tfjob:2222" for i in range(n)] for r, n in cluster.items()},
                "task": {"type": role, "index": index}, "environment": "cloud"}
            assert (env["TRAINHOOK_JOB_NAME"], env["TRAINHOOK_ROLE"], env["TRAINHOOK_RANK"]) == (
                "tfjob", role, str(rank))
            rank += 1


def test_a_refusal_is_allowed_false_with_the_message(webhook):
    reply = webhook.post(review(statefulset("x", 2, service="")))
    response = reply.json()["response"]
    assert reply.status_code == 200 and response["allowed"] is False
    assert response["status"]["code"] == 403
    assert "spec.serviceName" in response["status"]["message"]
    assert "patch" not in response


def test_a_kept_variable_comes_back_as_a_warning(webhook):
    sts, _ = admitted(webhook, statefulset("w", 2))
    pod = pod_of_statefulset(sts, 0)
    pod["spec"]["containers"][0]["env"] = [{"name": "WORLD_SIZE", "value": "99"}]
    mutated, response = admitted(webhook, pod)
    assert response["warnings"] == ["container trainer: kept your WORLD_SIZE=99; trainhook would set 2"]
    assert [e for e in mutated["spec"]["containers"][0]["env"] if e["name"] == "WORLD_SIZE"] == [
        {"name": "WORLD_SIZE", "value": "99"}]


def test_a_mutated_object_comes_back_without_a_patch(webhook):
    sts, _ = admitted(webhook, statefulset("again", 3))
    pod, _ = admitted(webhook, pod_of_statefulset(sts, 1))
    _, response = admitted(webhook, pod)
    assert response["allowed"] is True and "patch" not in response


def test_unlabeled_and_delete_reviews_are_allowed_untouched(webhook):
    plain = service("plain")
    plain["metadata"]["labels"] = {}
    _, response = admitted(webhook, plain)
    assert response == {"uid": response["uid"], "allowed": True}
    _, response = admitted(webhook, statefulset("gone", 2), operation="DELETE")
    assert "patch" not in response and response["allowed"] is True


@pytest.mark.parametrize("raw,reason", [
    (b"not json", "not JSON"),
    (b"[1, 2]", "JSON object"),
    (json.dumps({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}).encode(), "expected"),
    (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).encode(), "request"),
    (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                 "request": {"uid": "u", "kind": {"kind": "Pod"}, "operation": "CREATE"}}).encode(), "object"),
    (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                 "request": {"uid": "u", "kind": {"kind": "Pod"}, "operation": "PATCH", "object": {}}}).encode(),
     "operation"),
    (json.dumps(review({**bare_pod("p", {}, {}), "metadata": {"labels": {"trainhook.dev/framework": "pytorch"},
                                                               "annotations": ["x"]}})).encode(), "unexpected type"),
])
def test_malformed_reviews_are_http_400_with_a_reason(webhook, raw, reason):
    reply = webhook.post(None, raw=raw)
    assert reply.status_code == 400
    assert reason in reply.json()["error"]


def test_only_tls_1_2_or_newer_is_offered(webhook):
    host, port = webhook.url.removeprefix("https://").split(":")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(webhook.ca_file)
    context.minimum_version = context.maximum_version = ssl.TLSVersion.TLSv1_1
    context.set_ciphers("DEFAULT:@SECLEVEL=0")
    with socket.create_connection((host, int(port)), timeout=5) as raw, pytest.raises(ssl.SSLError):
        context.wrap_socket(raw, server_hostname=host).do_handshake()
