"""The pod mutation writes only into the copies `pods.writable` makes and shares the rest of the review's
object: for every kind of change the webhook makes to a pod, the review's object is left exactly as it came,
and the patch turns it into the mutated pod."""

from __future__ import annotations

import base64
import json

import jsonpatch
import pytest

from trainhook.webhook.admission.jsondiff import json_copy, same
from trainhook.webhook.admission.mutate import mutate
from trainhook.webhook.admission.review import review
from trainhook.webhook.settings import Settings
from objects import bare_pod, container, indexed_job, pod_of_job, pod_of_statefulset, review as make_review, \
    statefulset

GPU_TAINTS = Settings(extra_tolerations=({"key": "dedicated", "operator": "Equal", "value": "training",
                                          "effect": "NoSchedule"},), toleration_namespaces=frozenset({"team-a"}),
                      gang_key=b"k" * 32,
                      notary_url="https://trainhook.trainhook.svc:8444", notary_ca="PEM")


def sts_pod(annotations: dict | None = None, labels: dict | None = None, ordinal: int = 1, replicas: int = 3,
            **template_kwargs) -> dict:
    sts = mutate("StatefulSet", "CREATE", statefulset("g", replicas, labels=labels, annotations=annotations,
                                                      **template_kwargs), "team-a", GPU_TAINTS).obj
    return pod_of_statefulset(sts, ordinal)


def job_pod(index: int = 0, **kwargs) -> dict:
    job = mutate("Job", "CREATE", indexed_job("j", 2, **kwargs), "team-a", GPU_TAINTS).obj
    return pod_of_job(job, index)


def with_spec(pod: dict, **spec) -> dict:
    pod["spec"].update(spec)
    return pod


PODS = {
    "pytorch": lambda: sts_pod(),
    "pytorch with GPUs and the user's own env": lambda: sts_pod(containers=[
        container(gpus=2, env=[{"name": "LR", "value": "0.1"}, {"name": "RANK", "value": "7"}])]),
    "own tolerations and volumes": lambda: with_spec(sts_pod(containers=[container(gpus=1)]),
                                                    tolerations=[{"key": "x", "operator": "Exists"}],
                                                    volumes=[{"name": "data", "emptyDir": {}}]),
    "sidecar and a named training container": lambda: sts_pod(
        annotations={"trainhook.dev/container": "trainer"},
        containers=[container("sidecar", env=[{"name": "A", "value": "b"}]), container("trainer")]),
    "own init container": lambda: with_spec(sts_pod(), initContainers=[{"name": "fetch", "image": "busybox"}]),
    "mpi launcher": lambda: sts_pod(labels={"trainhook.dev/framework": "mpi"}, ordinal=0),
    "mpi worker with its own /etc/mpi": lambda: with_spec(
        sts_pod(labels={"trainhook.dev/framework": "mpi"}, ordinal=2,
                containers=[dict(container(), volumeMounts=[{"name": "m", "mountPath": "/etc/mpi"}])]),
        volumes=[{"name": "m", "emptyDir": {}}]),
    "tensorflow": lambda: sts_pod(labels={"trainhook.dev/framework": "tensorflow"}),
    "xgboost": lambda: sts_pod(labels={"trainhook.dev/framework": "xgboost"}),
    "jax": lambda: sts_pod(labels={"trainhook.dev/framework": "jax"}),
    "paddle": lambda: sts_pod(labels={"trainhook.dev/framework": "paddle"}),
    "kueue": lambda: sts_pod({"trainhook.dev/gang-scheduler": "kueue", "trainhook.dev/queue": "q"}),
    "volcano with a priority class": lambda: sts_pod({"trainhook.dev/gang-scheduler": "volcano",
                                                      "trainhook.dev/queue": "q",
                                                      "trainhook.dev/priority-class": "high"}),
    "coscheduling": lambda: sts_pod({"trainhook.dev/gang-scheduler": "coscheduling"}),
    "bare pod with a priority the plugin filled in": lambda: with_spec(
        bare_pod("b-0", {"trainhook.dev/index": "0", "trainhook.dev/job-name": "b"},
                 {"trainhook.dev/replicas": "worker=1", "trainhook.dev/priority-class": "high"}),
        priority=0, preemptionPolicy="PreemptLowerPriority"),
    "indexed job pod": lambda: job_pod(1),
    "gang wait none, elastic": lambda: sts_pod({"trainhook.dev/gang-wait": "none",
                                                "trainhook.dev/elastic": "2:3"}),
    "lifecycle options": lambda: sts_pod({"trainhook.dev/on-failure": "restart-gang",
                                          "trainhook.dev/deadline-seconds": "60"}),
    "refused late, after the env was set: a hostname peers cannot dial": lambda: with_spec(job_pod(0),
                                                                                           hostname="other"),
}


@pytest.mark.parametrize("name", PODS)
def test_the_reviews_object_is_left_as_it_came_and_the_patch_gives_the_mutated_pod(name):
    sent = make_review(PODS[name]())
    before = json_copy(sent)
    response = review(sent, GPU_TAINTS).answer["response"]
    assert same(sent, before), "the mutation wrote into the review's object"
    if not response["allowed"]:
        assert name.startswith("refused")
        return
    assert response.get("patch"), "every case here is a pod the webhook changes"
    patched = jsonpatch.apply_patch(before["request"]["object"], json.loads(base64.b64decode(response["patch"])))
    assert same(patched, mutate("Pod", "CREATE", before["request"]["object"], "team-a", GPU_TAINTS).obj)
    again = review(make_review(patched), GPU_TAINTS).answer["response"]
    assert again["allowed"] and "patch" not in again, "mutating a mutated pod must change nothing"
