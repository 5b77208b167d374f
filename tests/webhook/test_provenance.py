"""Which controller made a gang pod (issue 31 item 1: the confused deputy): a pod that names a StatefulSet or Job
as its controller is admitted only from that controller, and stamped so the notary can tell later
(webhook/admission/provenance.py). Through the real review() with the userInfo the API server sends."""

from __future__ import annotations

import base64
import copy
import json

import jsonpatch

from trainhook.gang import keys
from trainhook.webhook.admission import provenance
from trainhook.webhook.admission.mutate import mutate
from trainhook.webhook.admission.review import review as answer
from trainhook.webhook.settings import Settings
from objects import ADMIN_USERINFO, bare_pod, indexed_job, pod_of_job, pod_of_statefulset, review, statefulset

KEY = b"k" * 32
SETTINGS = Settings(gang_key=KEY)


def admitted_pod(sts_or_job: dict, index: int = 0, user: dict | None = None, settings: Settings = SETTINGS):
    """(the review's response, the pod as the API server stores it) for pod `index` of an admitted workload."""
    workload = mutate(sts_or_job["kind"], "CREATE", sts_or_job, "team-a", settings).obj
    pod = (pod_of_statefulset if workload["kind"] == "StatefulSet" else pod_of_job)(workload, index)
    response = answer(review(pod, user=user), settings).answer["response"]
    if response.get("patch"):
        pod = jsonpatch.apply_patch(pod, json.loads(base64.b64decode(response["patch"])))
    return response, pod


def test_a_controller_made_pod_is_stamped_and_the_stamp_verifies():
    for workload in (statefulset("ddp", 2), indexed_job("ij", 2)):
        response, pod = admitted_pod(workload, 1)
        assert response["allowed"] is True, response
        assert pod["metadata"]["annotations"][keys.PROVENANCE].startswith("v1 ")
        assert provenance.verify(KEY, "team-a", pod)
        assert not provenance.verify(b"another key" * 3, "team-a", pod)


def test_a_pod_claiming_a_statefulset_but_created_by_a_user_is_refused_naming_who():
    alice = {"username": "alice", "groups": ["system:authenticated"]}
    response, _ = admitted_pod(statefulset("db", 2), 0, user=alice)
    assert response["allowed"] is False
    assert response["status"]["message"] == (
        "trainhook: ownerReferences[StatefulSet]='db': a gang pod controlled by StatefulSet db is created by the "
        "StatefulSet controller (system:serviceaccount:kube-system:statefulset-controller), but alice created this "
        "one; create the StatefulSet instead and let its controller make the pods; if the cluster's "
        "controller-manager runs as another user, give it to the webhook (--controller-users)")
    response, _ = admitted_pod(indexed_job("ij", 2), 0, user=copy.deepcopy(ADMIN_USERINFO))
    assert response["allowed"] is False and "but kubernetes-admin created this one" in response["status"]["message"]


def test_a_controller_manager_running_as_another_user_is_named_by_the_operator():
    k3s = {"username": "system:k3s-controller", "groups": ["system:authenticated"]}
    assert admitted_pod(statefulset("ddp", 2), 0, user=k3s)[0]["allowed"] is False
    allowed = Settings(gang_key=KEY, controller_users=("system:k3s-controller",))
    response, pod = admitted_pod(statefulset("ddp", 2), 0, user=k3s, settings=allowed)
    assert response["allowed"] is True and provenance.verify(KEY, "team-a", pod)


def test_what_is_patched_after_admission_no_longer_verifies():
    """ownerReferences and labels are writable after CREATE without the webhook: the stamp then says no."""
    _, pod = admitted_pod(statefulset("vic", 2), 0)
    moved = copy.deepcopy(pod)
    moved["metadata"]["ownerReferences"][0].update(name="db", uid="db-uid")  # pointed at another StatefulSet
    relabeled = copy.deepcopy(pod)
    relabeled["metadata"]["labels"][keys.JOB_NAME] = "other"  # moved into another gang
    renamed = copy.deepcopy(pod)
    renamed["metadata"]["name"] = "vic-1"  # a copy of the stamp on another pod of the same StatefulSet
    for pod_now in (moved, relabeled, renamed):
        assert not provenance.verify(KEY, "team-a", pod_now)
    assert not provenance.verify(KEY, "team-b", pod)


def test_a_stamp_written_by_the_creator_is_never_kept():
    forged = bare_pod("p", {keys.JOB_NAME: "p", keys.INDEX: "0"}, {keys.REPLICAS: "worker=1",
                                                                   keys.PROVENANCE: "v1 " + "0" * 64})
    out = mutate("Pod", "CREATE", forged, "team-a", SETTINGS, "alice").obj
    assert keys.PROVENANCE not in out["metadata"]["annotations"]  # a bare pod: no controller to vouch for
    sts = mutate("StatefulSet", "CREATE", statefulset("ddp", 1), "team-a", SETTINGS).obj
    pod = pod_of_statefulset(sts, 0)
    pod["metadata"].setdefault("annotations", {})[keys.PROVENANCE] = "v1 " + "0" * 64
    out = mutate("Pod", "CREATE", pod, "team-a", SETTINGS, "system:serviceaccount:kube-system:statefulset-controller")
    assert out.obj["metadata"]["annotations"][keys.PROVENANCE] != "v1 " + "0" * 64
    assert provenance.verify(KEY, "team-a", out.obj)


def test_without_a_gang_key_nothing_is_stamped():
    _, pod = admitted_pod(statefulset("ddp", 1), 0, settings=Settings())
    assert keys.PROVENANCE not in (pod["metadata"].get("annotations") or {})
