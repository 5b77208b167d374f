"""The notary over real HTTPS against a real kube-apiserver (v1.20, started by the tests): real pod-bound tokens
from the TokenRequest API, verified by a real TokenReview; pods made by the real StatefulSet controller.

The webhook runs as its console script with `--notary-authority cluster` (KUBECONFIG: the admin; what the chart
grants it is checked in test_chart_notary.py). Each test works in a fresh namespace. The pods stay Pending (no
kubelet): the notary needs only their objects, which is what a TokenReview binds a token to.
"""

from __future__ import annotations

import hashlib
import hmac

import requests
from kubernetes import client

from cluster_api import NOTARY_GANG_KEY
from helpers import wait_for

GANG_KEY = NOTARY_GANG_KEY  # the key of the `notary` fixture (tests/cluster/conftest.py)
SA = "trainer"


def call(notary, method: str, path: str, token: str | None, body: dict | None = None) -> requests.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return requests.request(method, notary.notary_url + path, json=body, headers=headers,
                            verify=str(notary.ca_file), timeout=20)


def gang_template(job: str, replicas: int, extra_labels: dict | None = None, role: str = "worker") -> dict:
    """A pod template as the webhook leaves it on an admitted StatefulSet: the gang's labels and shape stamped (the
    `notary` fixture's webhook admits it again, and its pods)."""
    labels = {"app": job, "trainhook.dev/framework": "pytorch", "trainhook.dev/job-name": job,
              "trainhook.dev/role": role, **(extra_labels or {})}
    return {"metadata": {"labels": labels, "annotations": {"trainhook.dev/replicas": f"{role}={replicas}"}},
            "spec": {"serviceAccountName": SA, "automountServiceAccountToken": False,
                     "containers": [{"name": "trainer", "image": "example.com/train:1",
                                     "command": ["python", "train.py"]}]}}


def create_gang(api, namespace: str, job: str, replicas: int = 2) -> dict:
    """A StatefulSet gang; returns it once its controller has created every pod."""
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    try:
        core.create_namespaced_service_account(namespace, {"metadata": {"name": SA}})
    except client.ApiException as e:
        if e.status != 409:
            raise
    sts = apps.create_namespaced_stateful_set(namespace, {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": job, "labels": {"trainhook.dev/framework": "pytorch", "trainhook.dev/job-name": job}},
        "spec": {"replicas": replicas, "serviceName": job, "podManagementPolicy": "Parallel",
                 "selector": {"matchLabels": {"app": job}}, "template": gang_template(job, replicas)}})
    wait_for(f"{replicas} pods of {job}", lambda: len(core.list_namespaced_pod(
        namespace, label_selector=f"app={job}").items) == replicas, timeout=60)
    return api.sanitize_for_serialization(sts)


def scale_up_again(api, namespace: str, job: str, replicas: int) -> list:
    """Scale a StatefulSet gang the notary stopped back to `replicas`; its new pods once the controller has created
    them all. The stopped gang's pods may still be there when the scale lands (the controller deletes them on its
    own time), so new pods are told by their UIDs: a token requested for an old pod is bound to that pod and the
    API server invalidates it when the pod goes ("Pod UID ... does not match claim", seen in CI)."""
    core = client.CoreV1Api(api)
    selector = f"app={job}"
    old = {p.metadata.uid for p in core.list_namespaced_pod(namespace, label_selector=selector).items}
    client.AppsV1Api(api).patch_namespaced_stateful_set_scale(job, namespace, {"spec": {"replicas": replicas}})

    def new_pods():
        pods = core.list_namespaced_pod(namespace, label_selector=selector).items
        return (len(pods) == replicas and not any(p.metadata.uid in old for p in pods)
                and sorted(pods, key=lambda p: p.metadata.name))
    return wait_for(f"{replicas} new pods of {job}", new_pods, timeout=60)


def pod_token(api, namespace: str, pod: str, audience: str = "trainhook") -> str:
    """What the kubelet writes into the projected volume: a token bound to the pod, by the TokenRequest API."""
    core = client.CoreV1Api(api)
    uid = core.read_namespaced_pod(pod, namespace).metadata.uid
    answer = core.create_namespaced_service_account_token(SA, namespace, {
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"audiences": [audience], "expirationSeconds": 3600,
                 "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": uid}}})
    return answer.status.token


def expected_key(namespace: str, job: str, uid: str) -> tuple[str, str]:
    gang = f"{namespace}/{job}/{uid}"
    return gang, hmac.new(GANG_KEY, gang.encode(), hashlib.sha256).hexdigest()


def outcome(phase: str = "Failed", code: int = 3, rank: int = 1, reason: str = "rank 1 exited 3",
            pod: str = "") -> dict:
    body = {"phase": phase, "code": code, "reason": reason, "rank": rank, "time": "2024-05-06T07:08:09Z",
            "attempt": 1, "restarts": 0}
    return {"outcome": {**body, "pod": pod} if pod else body}


def test_every_member_gets_the_gangs_key(notary, control_plane, k8s_namespace):
    api = control_plane.api_client()
    sts = create_gang(api, k8s_namespace, "keyed")
    gang, key = expected_key(k8s_namespace, "keyed", sts["metadata"]["uid"])
    for pod in ("keyed-0", "keyed-1"):
        answer = call(notary, "POST", "/v1/credential", pod_token(api, k8s_namespace, pod), {})
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"namespace": k8s_namespace, "job": "keyed", "gang": gang, "key": key}


def imposter_pod(job: str, index: int, name: str) -> dict:
    """A bare pod that copies the gang's labels and shape, as the webhook would admit it (its hostname set). A pod
    with a forged owner is in test_notary_membership.py: the garbage collector deletes one whose owner is gone."""
    pod = gang_template(job, 2)
    pod["metadata"].update(name=name, labels={**pod["metadata"]["labels"], "app": "other",
                                              "trainhook.dev/index": str(index)})
    pod["spec"].update(hostname=f"{job}-worker-{index}", subdomain=job)
    return {"apiVersion": "v1", "kind": "Pod", **pod}


def test_a_pod_merely_labeled_with_the_job_name_is_refused_and_logged_once(notary, control_plane,
                                                                         k8s_namespace):
    api = control_plane.api_client()
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    sts = create_gang(api, k8s_namespace, "victim")
    core.create_namespaced_pod(k8s_namespace, imposter_pod("victim", 1, "imposter"))
    bare = pod_token(api, k8s_namespace, "imposter")
    for _ in range(3):
        answer = call(notary, "POST", "/v1/credential", bare, {})
        assert answer.status_code == 403, answer.text
        assert "not of gang" in answer.json()["error"] and "rank 0 is victim-0" in answer.json()["error"]
        assert "key" not in answer.json()
    assert call(notary, "POST", "/v1/outcome", bare, outcome("Succeeded", 0, 0, "forged")).status_code == 403
    logged = [line for line in notary.log_file.read_text().splitlines()
              if "notary refused" in line and f"{k8s_namespace}/imposter" in line]
    assert len(logged) == 1, logged  # four refusals for the same (pod, reason): one line

    # Two look-alikes (one at rank 0) make a gang of bare Pods of their own: another identity, another key, and
    # their record touches nothing of the real gang.
    core.create_namespaced_pod(k8s_namespace, imposter_pod("victim", 0, "rank0"))
    rank0 = pod_token(api, k8s_namespace, "rank0")
    real = call(notary, "POST", "/v1/credential", pod_token(api, k8s_namespace, "victim-1"), {}).json()
    assert real["gang"] == expected_key(k8s_namespace, "victim", sts["metadata"]["uid"])[0]
    for token in (bare, rank0):
        theirs = call(notary, "POST", "/v1/credential", token, {}).json()
        assert theirs["key"] != real["key"] and theirs["gang"] != real["gang"]
    assert call(notary, "POST", "/v1/outcome", rank0, outcome("Succeeded", 0, 0, "forged")).status_code == 200
    after = apps.read_namespaced_stateful_set("victim", k8s_namespace)
    assert "trainhook.dev/phase" not in (after.metadata.annotations or {})
    assert after.spec.replicas == 2
    assert call(notary, "GET", "/v1/outcome", pod_token(api, k8s_namespace, "victim-0")).json() == {"outcome": None}


def test_a_token_of_another_audience_or_none_is_unauthenticated(notary, control_plane, k8s_namespace):
    api = control_plane.api_client()
    create_gang(api, k8s_namespace, "aud")
    other = call(notary, "POST", "/v1/credential", pod_token(api, k8s_namespace, "aud-0", audience="vault"), {})
    assert other.status_code == 401, other.text
    assert "not authenticated" in other.json()["error"]
    assert call(notary, "POST", "/v1/credential", None, {}).status_code == 401
    assert call(notary, "POST", "/v1/credential", "not-a-token", {}).status_code == 401


def test_only_the_coordinator_records_and_the_record_stops_and_tells(notary, control_plane,
                                                                      k8s_namespace):
    api = control_plane.api_client()
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    create_gang(api, k8s_namespace, "rec")
    member, coordinator = pod_token(api, k8s_namespace, "rec-1"), pod_token(api, k8s_namespace, "rec-0")
    claimed = call(notary, "POST", "/v1/outcome", member, outcome("Succeeded", 0, 1, "I say we are done"))
    assert claimed.status_code == 403, claimed.text
    assert "not the coordinator" in claimed.json()["error"]
    assert call(notary, "GET", "/v1/outcome", member).json() == {"outcome": None}

    recorded = call(notary, "POST", "/v1/outcome", coordinator, outcome(pod="rec-1"))
    assert recorded.status_code == 200, recorded.text
    assert recorded.json()["outcome"]["phase"] == "Failed"
    sts = apps.read_namespaced_stateful_set("rec", k8s_namespace)
    assert sts.metadata.annotations["trainhook.dev/phase"] == "Failed"
    assert sts.metadata.annotations["trainhook.dev/exit-code"] == "3"
    assert sts.metadata.annotations["trainhook.dev/phase-reason"] == "rank 1 exited 3"
    assert sts.metadata.annotations["trainhook.dev/phase-time"] == "2024-05-06T07:08:09Z"
    assert sts.metadata.labels["trainhook.dev/phase"] == "Failed"  # kubectl get sts -l trainhook.dev/phase=Failed
    assert sts.spec.replicas == 0
    assert [s.metadata.name for s in apps.list_namespaced_stateful_set(
        k8s_namespace, label_selector="trainhook.dev/phase=Failed").items] == ["rec"]
    events = [e for e in core.list_namespaced_event(k8s_namespace).items if e.involved_object.name == "rec"
              and e.reason.startswith("Gang")]
    assert [(e.type, e.reason, e.involved_object.kind, e.involved_object.uid) for e in events] == [
        ("Warning", "GangFailed", "StatefulSet", sts.metadata.uid)]
    assert "rank 1 (pod rec-1) exited 3" in events[0].message

    # Scaled up again by hand, the same StatefulSet (the same gang) has its outcome already: it is not rewritten.
    scale_up_again(api, k8s_namespace, "rec", 2)
    member, coordinator = pod_token(api, k8s_namespace, "rec-1"), pod_token(api, k8s_namespace, "rec-0")
    second = call(notary, "POST", "/v1/outcome", coordinator, outcome("Succeeded", 0, 0, "all done"))
    assert second.status_code == 200, second.text
    assert second.json()["outcome"]["phase"] == "Failed"  # the first record stands
    after = apps.read_namespaced_stateful_set("rec", k8s_namespace)
    assert after.metadata.annotations["trainhook.dev/phase"] == "Failed" and after.spec.replicas == 2
    assert call(notary, "GET", "/v1/outcome", member).json()["outcome"]["code"] == 3

    emitted = call(notary, "POST", "/v1/event", coordinator,
                   {"type": "Normal", "reason": "GangRestarted", "message": "attempt 2 of 4"})
    assert emitted.status_code == 200, emitted.text
    assert call(notary, "POST", "/v1/event", member, {"type": "Normal", "reason": "GangRestarted",
                                                      "message": "forged"}).status_code == 403
    restarted = [e for e in core.list_namespaced_event(k8s_namespace).items if e.reason == "GangRestarted"]
    assert [e.message for e in restarted] == ["attempt 2 of 4"]
    bad = call(notary, "POST", "/v1/outcome", coordinator, {"outcome": {"phase": "Done", "code": 0}})
    assert bad.status_code == 400 and "outcome.phase" in bad.json()["error"]

    retried = call(notary, "POST", "/v1/outcome", coordinator, outcome(pod="rec-1"))  # the same record, again:
    assert retried.status_code == 200  # what an error may have interrupted is finished, and told once
    assert apps.read_namespaced_stateful_set("rec", k8s_namespace).spec.replicas == 0
    assert len([e for e in core.list_namespaced_event(k8s_namespace).items if e.reason == "GangFailed"]) == 1


def test_a_job_deleted_and_recreated_gets_another_key(notary, control_plane, k8s_namespace):
    api = control_plane.api_client()
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    first = create_gang(api, k8s_namespace, "again")
    old_token = pod_token(api, k8s_namespace, "again-0")
    old = call(notary, "POST", "/v1/credential", old_token, {}).json()
    apps.delete_namespaced_stateful_set("again", k8s_namespace, propagation_policy="Foreground")
    wait_for("the old gang's pods to be gone", lambda: not core.list_namespaced_pod(
        k8s_namespace, label_selector="app=again").items, timeout=60)
    wait_for("the old StatefulSet to be gone", lambda: not apps.list_namespaced_stateful_set(k8s_namespace).items)
    second = create_gang(api, k8s_namespace, "again")
    assert second["metadata"]["uid"] != first["metadata"]["uid"]
    new = call(notary, "POST", "/v1/credential", pod_token(api, k8s_namespace, "again-0"), {})
    assert new.status_code == 200, new.text
    assert new.json()["gang"] == expected_key(k8s_namespace, "again", second["metadata"]["uid"])[0]
    assert new.json()["key"] != old["key"]
    # The deleted pod's token: v1.20's TokenReview still authenticates it (it checks the name, not the uid, of a
    # pod of that name), and the notary's own uid check refuses it.
    stale = call(notary, "POST", "/v1/credential", old_token, {})
    assert stale.status_code == 403, stale.text
    assert "not the pod the token was issued to" in stale.json()["error"]



def test_a_pod_patched_after_admission_into_another_gang_or_owner_is_refused(notary, control_plane, k8s_namespace):
    """Pods are registered with the webhook at CREATE only: what is patched onto one later passes no admission.
    Here an admin patches a member onto another gang's StatefulSet (its ownerReference and job name): it gets no
    key, whichever check sees it first (its provenance stamp, webhook/admission/provenance.py, or its place, which no
    longer fits the owner it names). test_notary_membership.py shows the stamp alone refusing each such patch."""
    api = control_plane.api_client()
    core = client.CoreV1Api(api)
    create_gang(api, k8s_namespace, "mine")
    other = create_gang(api, k8s_namespace, "theirs")
    assert call(notary, "POST", "/v1/credential", pod_token(api, k8s_namespace, "mine-1"), {}).status_code == 200
    owner = {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "theirs", "uid": other["metadata"]["uid"],
             "controller": True, "blockOwnerDeletion": True}
    core.patch_namespaced_pod("mine-1", k8s_namespace, [  # a JSON patch: the owner replaced, not merged
        {"op": "replace", "path": "/metadata/ownerReferences", "value": [owner]},
        {"op": "replace", "path": "/metadata/labels/trainhook.dev~1job-name", "value": "theirs"}])
    answer = call(notary, "POST", "/v1/credential", pod_token(api, k8s_namespace, "mine-1"), {})
    assert answer.status_code == 403, answer.text
    assert "key" not in answer.json()
    # Refused for its stamp; or, once the StatefulSet controller has released the pod it never made (its labels
    # do not match `theirs`' selector: it removes the ownerReference), as a bare pod the webhook never admitted.
    error = answer.json()["error"]
    assert "trainhook.dev/provenance stamp does not match" in error or \
        "was not admitted as a member of gang theirs" in error, error
