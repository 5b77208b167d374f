"""trainhook local: pods made as the StatefulSet and Job controllers make them."""

from __future__ import annotations

import random

import pytest

from trainhook.gang import keys
from trainhook.local.controllers import (ControllerError, generate_name, job_pods, job_warnings, pod_requests,
                                         statefulset_pods, store)

TEMPLATE = {"metadata": {"labels": {"app": "t", keys.FRAMEWORK: "pytorch"}, "annotations": {"a": "1"}},
            "spec": {"containers": [{"name": "c", "command": ["run"]}]}}


def sts(**spec):
    return {"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": "ddp", "namespace": "ml", "uid": "u-1"},
            "spec": {"serviceName": "ddp-svc", "replicas": 2, "template": TEMPLATE, **spec}}


def job(**spec):
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train", "namespace": "ml", "uid": "u-2"},
            "spec": {"completionMode": "Indexed", "completions": 3, "parallelism": 3, "template": TEMPLATE, **spec}}


def test_statefulset_pods_are_named_by_ordinal_with_identity():
    pods = statefulset_pods(sts())
    assert [p["metadata"]["name"] for p in pods] == ["ddp-0", "ddp-1"]
    pod = pods[1]
    assert pod["metadata"]["namespace"] == "ml"
    assert pod["spec"]["hostname"] == "ddp-1"
    assert pod["spec"]["subdomain"] == "ddp-svc"
    labels = pod["metadata"]["labels"]
    assert labels["app"] == "t" and labels[keys.FRAMEWORK] == "pytorch"
    assert labels[keys.STATEFULSET_POD_NAME] == "ddp-1"
    assert labels["controller-revision-hash"].startswith("ddp-")
    assert pod["metadata"]["annotations"] == {"a": "1"}
    assert pod["metadata"]["ownerReferences"] == [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "ddp",
                                                   "uid": "u-1", "controller": True, "blockOwnerDeletion": True}]


def test_statefulset_replicas_default_to_one_and_zero_makes_none():
    spec = sts()
    del spec["spec"]["replicas"]
    assert len(statefulset_pods(spec)) == 1
    assert statefulset_pods(sts(replicas=0)) == []


def test_statefulset_without_service_name_is_refused():
    with pytest.raises(ControllerError, match="spec.serviceName"):
        statefulset_pods(sts(serviceName=""))


def test_volume_claim_templates_become_per_pod_claims():
    pods = statefulset_pods(sts(volumeClaimTemplates=[{"metadata": {"name": "data"}}]))
    assert pods[1]["spec"]["volumes"] == [{"name": "data", "persistentVolumeClaim": {"claimName": "data-ddp-1"}}]


def test_indexed_job_pods_use_generate_name_and_completion_index():
    pods = job_pods(job())
    assert len(pods) == 3
    pod = pods[2]
    assert "name" not in pod["metadata"]
    assert pod["metadata"]["generateName"] == "train-2-"
    assert pod["metadata"]["annotations"][keys.JOB_COMPLETION_INDEX] == "2"
    assert pod["metadata"]["labels"][keys.JOB_COMPLETION_INDEX] == "2"
    assert pod["metadata"]["labels"]["job-name"] == "train"
    assert pod["metadata"]["labels"]["controller-uid"] == "u-2"
    assert pod["spec"]["hostname"] == "train-2"
    assert "subdomain" not in pod["spec"]
    assert pod["metadata"]["ownerReferences"][0]["kind"] == "Job"
    env = pod["spec"]["containers"][0]["env"]
    assert env == [{"name": "JOB_COMPLETION_INDEX", "valueFrom": {"fieldRef": {
        "fieldPath": f"metadata.annotations['{keys.JOB_COMPLETION_INDEX}']"}}}]


def test_indexed_job_keeps_the_template_subdomain():
    template = {**TEMPLATE, "spec": {**TEMPLATE["spec"], "subdomain": "gang"}}
    assert job_pods(job(template=template))[0]["spec"]["subdomain"] == "gang"


def test_indexed_job_needs_completions():
    spec = job()
    del spec["spec"]["completions"]
    with pytest.raises(ControllerError, match="spec.completions is required"):
        job_pods(spec)


def test_a_gang_job_with_low_parallelism_is_warned_about():
    assert job_warnings(job()) == []
    (warning,) = job_warnings(job(parallelism=1))
    assert "parallelism 1 < completions 3" in warning


def test_the_template_is_not_shared_between_pods():
    pods = statefulset_pods(sts())
    pods[0]["spec"]["containers"][0]["command"].append("x")
    assert pods[1]["spec"]["containers"][0]["command"] == ["run"]
    assert TEMPLATE["spec"]["containers"][0]["command"] == ["run"]


def test_generated_names_look_like_the_apiservers():
    rng = random.Random(1)
    name = generate_name("train-2-", rng)
    assert name.startswith("train-2-") and len(name) == len("train-2-") + 5
    assert set(name[len("train-2-"):]) <= set("bcdfghjklmnpqrstvwxz2456789")
    assert len(generate_name("x" * 80, rng)) == 63


def test_storing_names_a_generated_pod_and_gives_it_a_uid():
    stored = store(job_pods(job())[0], random.Random(2))
    assert stored["metadata"]["name"].startswith("train-0-")
    assert len(stored["metadata"]["uid"]) == 36
    assert store(stored)["metadata"] == stored["metadata"]


def test_pod_requests_come_from_the_controllers_service_accounts():
    requests = pod_requests(sts())
    assert requests[0].user["username"] == "system:serviceaccount:kube-system:statefulset-controller"
    assert pod_requests(job())[0].user["username"] == "system:serviceaccount:kube-system:job-controller"
    assert pod_requests({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}) == []
