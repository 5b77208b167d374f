"""A Deployment, ReplicaSet, DaemonSet or ReplicationController labeled for training is refused at admission by
name (issue 34: never silently accepted), and so is a pod such a controller makes; an unlabeled one is untouched.

Why: these kinds make pods but never a gang (no stable index for a rank, no address a peer can resolve). Taken as
any unknown kind, the webhook admitted them untouched and refused their pods one by one for a shape they cannot
have, a message that named neither the kind nor the fix. Shown on the pure mutation and over HTTPS against the
real webhook server, as the API server sends the review (the chart registers these kinds: tests/chart)."""

from __future__ import annotations

import copy

import pytest

from trainhook.gang import keys
from trainhook.webhook.admission.member import Denied
from trainhook.webhook.admission.mutate import mutate
from trainhook.webhook.settings import Settings
from objects import bare_pod, review, statefulset

SETTINGS = Settings()


def labeled_workload(kind: str, on: str = "object") -> dict:
    """A Deployment-shaped object (all four kinds have spec.template), labeled on itself or its pod template."""
    obj = copy.deepcopy(statefulset("trainer", 2))
    api = "v1" if kind == "ReplicationController" else "apps/v1"
    obj.update({"apiVersion": api, "kind": kind})
    obj["spec"].pop("serviceName", None)
    obj["spec"].pop("podManagementPolicy", None)
    if on == "template":
        obj["metadata"]["labels"].pop(keys.FRAMEWORK)
    else:
        obj["spec"]["template"]["metadata"]["labels"].pop(keys.FRAMEWORK, None)
    return obj


@pytest.mark.parametrize("kind", keys.UNSUPPORTED_KINDS)
@pytest.mark.parametrize("operation", ["CREATE", "UPDATE"])
def test_a_labeled_unsupported_kind_is_refused_naming_the_kind_and_the_supported_ones(kind, operation):
    with pytest.raises(Denied) as caught:
        mutate(kind, operation, labeled_workload(kind), "team-a", SETTINGS)
    message = str(caught.value)
    assert message.startswith(f"metadata.labels.{keys.FRAMEWORK}='pytorch': {kind} is an unsupported kind"), message
    assert "the supported kinds are StatefulSet, Job (Indexed), Pod, Service" in message
    assert "make it a StatefulSet (with a headless Service as its serviceName) or an Indexed Job" in message


def test_a_label_on_the_pod_template_only_is_refused_too():
    with pytest.raises(Denied) as caught:
        mutate("Deployment", "CREATE", labeled_workload("Deployment", on="template"), "team-a", SETTINGS)
    assert str(caught.value).startswith(f"spec.template.metadata.labels.{keys.FRAMEWORK}='pytorch': Deployment is "
                                        "an unsupported kind")


def test_an_unlabeled_deployment_is_left_alone():
    obj = labeled_workload("Deployment")
    obj["metadata"]["labels"].pop(keys.FRAMEWORK)
    assert mutate("Deployment", "CREATE", obj, "team-a", SETTINGS).obj is obj


@pytest.mark.parametrize("owner", ["ReplicaSet", "DaemonSet", "ReplicationController"])
def test_a_pod_made_by_an_unsupported_controller_is_refused_naming_it(owner):
    pod = bare_pod("trainer-7d9f-x2k", {keys.JOB_NAME: "trainer"}, {keys.REPLICAS: "worker=2"})
    pod["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": owner, "name": "trainer-7d9f",
                                           "uid": "u-1", "controller": True}]
    with pytest.raises(Denied) as caught:
        mutate("Pod", "CREATE", pod, "team-a", SETTINGS)
    message = str(caught.value)
    assert f"ownerReferences[{owner}]='trainer-7d9f': the pod's controller is a {owner}, an unsupported kind" in message
    assert "the supported kinds are StatefulSet, Job (Indexed), Pod, Service" in message


def test_an_upper_case_name_is_refused_for_its_case_not_its_length():
    pod = bare_pod("Trainer-0", {keys.JOB_NAME: "Trainer"}, {keys.REPLICAS: "worker=2"})
    pod["metadata"]["labels"][keys.INDEX] = "0"
    with pytest.raises(Denied) as caught:
        mutate("Pod", "CREATE", pod, "team-a", SETTINGS)
    message = str(caught.value)
    assert message == ("spec.hostname='Trainer-worker-0': the pod's address must be lower case (an RFC 1123 DNS "
                       "label); write trainhook.dev/job-name and the workload's name in lower case, e.g. "
                       "'trainer-worker-0'")


def test_the_real_server_refuses_a_labeled_deployment_with_a_403_naming_it(webhook):
    answer = webhook.post(review(labeled_workload("Deployment"))).json()["response"]
    assert answer["allowed"] is False and answer["status"]["code"] == 403
    assert "Deployment is an unsupported kind" in answer["status"]["message"]
    unlabeled = labeled_workload("DaemonSet")
    unlabeled["metadata"]["labels"].pop(keys.FRAMEWORK)
    answer = webhook.post(review(unlabeled)).json()["response"]
    assert answer["allowed"] is True and "patch" not in answer
