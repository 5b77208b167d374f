"""The sweep's pure decision (webhook/notary/sweep.py): which finished gang Job nobody recorded it records, and what.

The Job and its pods are what the real webhook admitted (mutate(), then each pod's review with the Job controller's
userInfo, stamped with the gang key), with the status the Job controller and the kubelet would give them. The
sweep against a real API server and Job controller is tests/cluster/test_notary_sweep_cluster.py.
"""

from __future__ import annotations

import base64
import copy
import json

import jsonpatch

from objects import indexed_job, pod_of_job, review
from trainhook.gang import keys
from trainhook.webhook.admission.mutate import mutate
from trainhook.webhook.admission.review import review as answer
from trainhook.webhook.notary.sweep import finished, orphan_outcome
from trainhook.webhook.settings import Settings

KEY = b"k" * 32
NS = "team-a"
FAILED_AT = {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
             "message": "Job has reached the specified backoff limit", "lastTransitionTime": "2026-11-27T10:00:09Z"}
COMPLETE_AT = {"type": "Complete", "status": "True", "lastTransitionTime": "2026-11-27T10:00:09Z"}


def admitted(job: dict, uid: str = "job-uid") -> tuple[dict, list[dict]]:
    """The Job as stored after admission, and its pods as the Job controller makes them and the webhook admits."""
    job = mutate("Job", "CREATE", job, NS, Settings(gang_key=KEY)).obj
    job["metadata"]["uid"] = uid
    pods = []
    for index in range(job["spec"]["completions"]):
        pod = pod_of_job(job, index)
        pod["metadata"]["ownerReferences"][0]["uid"] = uid
        response = answer(review(pod), Settings(gang_key=KEY)).answer["response"]
        assert response["allowed"], response
        pod = jsonpatch.apply_patch(pod, json.loads(base64.b64decode(response["patch"])))
        pod["metadata"]["name"] = f"{job['metadata']['name']}-{index}-x{index}"
        pods.append(pod)
    return job, pods


def ended(pod: dict, code: int, at: str = "2026-11-27T10:00:05Z") -> dict:
    pod = copy.deepcopy(pod)
    pod["status"] = {"phase": "Succeeded" if code == 0 else "Failed", "containerStatuses": [
        {"name": "trainer", "state": {"terminated": {"exitCode": code, "finishedAt": at}}}]}
    return pod


def test_a_job_is_finished_only_by_a_true_complete_or_failed_condition():
    assert finished({"status": {"conditions": [FAILED_AT]}}) == ("Failed", FAILED_AT)
    assert finished({"status": {"conditions": [COMPLETE_AT]}}) == ("Succeeded", COMPLETE_AT)
    assert finished({"status": {"conditions": [{**FAILED_AT, "status": "False"}]}}) is None
    assert finished({"status": {"conditions": [{"type": "Suspended", "status": "True"}]}}) is None
    assert finished({"status": {}}) is None


def test_a_failed_gang_job_is_recorded_with_the_first_failing_rank_its_pod_and_its_exit_code():
    job, pods = admitted(indexed_job("ddp", 3))
    gone = [ended(pods[1], 3, "2026-11-27T10:00:05Z"), ended(pods[2], 143, "2026-11-27T10:00:08Z")]  # rank 0 deleted
    outcome, member = orphan_outcome(job, "Failed", FAILED_AT, gone, KEY)
    assert (outcome["phase"], outcome["code"], outcome["rank"], outcome["pod"]) == ("Failed", 3, 1, "ddp-1-x1")
    assert outcome["time"] == "2026-11-27T10:00:09Z"  # the condition's: two replicas compute the same record
    assert "BackoffLimitExceeded" in outcome["reason"] and "coordinator" in outcome["reason"]
    assert member.job_name == "ddp"


def test_a_completed_gang_job_is_recorded_succeeded():
    job, pods = admitted(indexed_job("ddp", 2))
    outcome, _ = orphan_outcome(job, "Succeeded", COMPLETE_AT, [ended(p, 0) for p in pods], KEY)
    assert (outcome["phase"], outcome["code"], outcome["rank"]) == ("Succeeded", 0, 0)


def test_nothing_is_recorded_while_a_pod_still_runs_its_coordinator_may_still_record_better():
    job, pods = admitted(indexed_job("ddp", 2))
    still = copy.deepcopy(pods[0])
    still["status"] = {"phase": "Running"}
    assert orphan_outcome(job, "Failed", FAILED_AT, [still, ended(pods[1], 3)], KEY) is None


def test_a_job_no_stamped_pod_proves_a_gangs_is_left_alone():
    job, pods = admitted(indexed_job("ddp", 2))
    forged = [ended(p, 3) for p in pods]
    for pod in forged:  # made by hand, naming the Job: the stamp does not match what it says
        pod["metadata"]["annotations"][keys.PROVENANCE] = "v1 " + "0" * 64
    assert orphan_outcome(job, "Failed", FAILED_AT, forged, KEY) is None
    assert orphan_outcome(job, "Failed", FAILED_AT, [ended(p, 3) for p in pods], b"another gang key" * 2) is None
    assert orphan_outcome(job, "Failed", FAILED_AT, [], KEY) is None  # every pod gone: nothing proves it


def test_pods_of_another_job_prove_nothing_and_an_unlabeled_job_is_not_a_gangs():
    job, pods = admitted(indexed_job("ddp", 2))
    other, _ = admitted(indexed_job("ddp", 2), uid="another-uid")
    assert orphan_outcome(other, "Failed", FAILED_AT, [ended(p, 3) for p in pods], KEY) is None
    unlabeled = copy.deepcopy(job)
    del unlabeled["metadata"]["labels"][keys.FRAMEWORK]
    del unlabeled["spec"]["template"]["metadata"]["labels"][keys.FRAMEWORK]
    assert orphan_outcome(unlabeled, "Failed", FAILED_AT, [ended(p, 3) for p in pods], KEY) is None


def test_a_multi_role_gangs_other_role_job_is_not_the_anchor():
    shape = {"trainhook.dev/replicas": "chief=1,worker=2"}
    chief, chief_pods = admitted(indexed_job("tf-chief", 1, labels={keys.JOB_NAME: "tf", keys.ROLE: "chief",
                                                                    keys.FRAMEWORK: "tensorflow"},
                                             annotations=shape), uid="chief-uid")
    worker, worker_pods = admitted(indexed_job("tf-worker", 2, labels={keys.JOB_NAME: "tf", keys.ROLE: "worker",
                                                                       keys.FRAMEWORK: "tensorflow"},
                                               annotations=shape), uid="worker-uid")
    pods = [ended(p, 0) for p in chief_pods + worker_pods]
    assert orphan_outcome(worker, "Succeeded", COMPLETE_AT, pods, KEY) is None
    outcome, member = orphan_outcome(chief, "Succeeded", COMPLETE_AT, pods, KEY)
    assert (outcome["phase"], member.role, member.shape.roles) == ("Succeeded", "chief", ("chief", "worker"))
