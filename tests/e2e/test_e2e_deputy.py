"""The notary acts only for its own gang (issue 31 item 1), tried on the node with a default install, by users of a
shared namespace as the issue saw them:

- `mallory` may only create and read pods. Seen before: her pod `db-00`, whose ownerReference names an unrelated,
  unlabeled StatefulSet `db` and whose labels make it rank 0 of a gang `db`, got `Succeeded` recorded on `db` and
  `db` scaled from 2 to 0. Now the webhook refuses the pod at admission (a pod naming a StatefulSet as its
  controller is that controller's to create), naming who created it; the same pod without the ownerReference is a
  bare-Pod gang of its own, which finishes and is recorded on itself, and `db` is untouched.
- `eve` has `edit`. Seen before: her StatefulSet `evil`, whose template carries another team's job name `vic1`,
  finished and the notary marked the running `vic1` `Succeeded` and scaled it to 0. Now `evil` is a gang of its own
  (rank 0 is `evil-0`, not `vic1-0`): it finishes and is recorded on `evil`; `vic1` keeps training, unrecorded, at
  its size.
"""

from __future__ import annotations

import json
import subprocess

from e2e_gangs import statefulset, statefulset_gang
from e2e_helpers import wait_for, wait_pod_phase

SLEEP = ["sh", "-c", "echo up; exec sleep 3600"]
TRAIN_LONG = ["python", "-c", "import time; print('training', flush=True); time.sleep(3600)"]
FINISH = ["python", "-c", "print('done', flush=True)"]


def users(node, namespace: str) -> None:
    """mallory: create and read pods only; eve: the built-in `edit` role; both in `namespace` only."""
    node.apply(namespace, [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "pod-maker"},
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "mallory"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-maker"},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "mallory"}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "eve"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "eve"}]}])


def create_as(node, user: str, namespace: str, obj: dict) -> tuple[bool, str]:
    """(created, what kubectl said) for `obj` created by `user`."""
    done = subprocess.run([node.kubectl_bin, "create", f"--as={user}", "-n", namespace, "-f", "-"],
                          input=json.dumps(obj), capture_output=True, text=True, env=node.env, timeout=60)
    return done.returncode == 0, done.stderr + done.stdout


def trainhook_marks(obj: dict) -> dict:
    meta = obj["metadata"]
    return {k: v for k, v in {**(meta.get("labels") or {}), **(meta.get("annotations") or {})}.items()
            if k.startswith("trainhook.dev/") and k != "trainhook.dev/framework"}


def rank0_pod(name: str, image: str, owner: dict | None) -> dict:
    meta = {"name": f"{name}-00", "labels": {"trainhook.dev/framework": "pytorch", "trainhook.dev/job-name": name,
                                             "trainhook.dev/index": "0"},
            "annotations": {"trainhook.dev/replicas": "worker=1"}}
    if owner:
        meta["ownerReferences"] = [owner]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"restartPolicy": "Never", "containers": [{
                "name": "trainer", "image": image, "imagePullPolicy": "Never", "command": FINISH,
                "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}}}]}}


def test_a_pod_only_user_cannot_make_the_notary_record_on_or_stop_an_unrelated_statefulset(node, release, namespace):
    users(node, namespace)
    db = {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "db"},
          "spec": {"replicas": 2, "serviceName": "db", "selector": {"matchLabels": {"app": "db"}},
                   "template": {"metadata": {"labels": {"app": "db"}}, "spec": {
                       "terminationGracePeriodSeconds": 1,
                       "containers": [{"name": "db", "image": node.images["torch"], "imagePullPolicy": "Never",
                                       "command": SLEEP, "resources": {"requests": {"cpu": "20m"}}}]}}}}
    node.apply(namespace, [db])
    uid = statefulset(node, "db", namespace)["metadata"]["uid"]  # what `get` on the StatefulSet tells anyone
    owner = {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db", "uid": uid, "controller": True,
             "blockOwnerDeletion": True}
    created, said = create_as(node, "mallory", namespace, rank0_pod("db", node.images["torch"], owner))
    print(said)
    assert not created and "created by the StatefulSet controller" in said and "mallory created this one" in said, \
        said
    # The same pod as her own bare-Pod gang: it runs, finishes and is recorded on itself; db is never touched. (Its
    # headless Service, so that its hostname resolves, is the namespace admin's: mallory may create pods only.)
    node.apply(namespace, [{"apiVersion": "v1", "kind": "Service",
                            "metadata": {"name": "db", "labels": {"trainhook.dev/job-name": "db"}},
                            "spec": {"clusterIP": "None", "selector": {"trainhook.dev/job-name": "db"}}}])
    created, said = create_as(node, "mallory", namespace, rank0_pod("db", node.images["torch"], None))
    assert created, said
    wait_pod_phase(node, namespace, "db-00", {"Succeeded", "Failed"}, 180)
    wait_for(lambda: any(e.get("reason") == "GangSucceeded" for e in json.loads(node.kubectl(
        "get", "events", "-n", namespace, "--field-selector", "involvedObject.name=db-00", "-o", "json"))["items"]),
        60, "the bare-Pod gang's own outcome, told on its pod")
    after = statefulset(node, "db", namespace)
    assert after["spec"]["replicas"] == 2 and trainhook_marks(after) == {}, after["metadata"]
    db_events = json.loads(node.kubectl("get", "events", "-n", namespace, "--field-selector",
                                        "involvedObject.name=db,involvedObject.kind=StatefulSet", "-o", "json"))
    assert not [e for e in db_events["items"] if (e.get("source") or {}).get("component") == "trainhook-notary"]


def test_an_edit_users_look_alike_with_another_teams_job_name_never_touches_that_gang(node, release, namespace):
    users(node, namespace)
    node.apply(namespace, statefulset_gang("vic1", node.images["torch"], TRAIN_LONG, 2))
    wait_for(lambda: all("training" in node.logs(namespace, f"vic1-{i}", "trainer").splitlines() for i in range(2)), 180,
             "vic1's two members to train")
    _, evil = statefulset_gang("evil", node.images["torch"], FINISH, 1)
    evil["spec"]["template"]["metadata"]["labels"]["trainhook.dev/job-name"] = "vic1"
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "evil"},  # so evil-0.evil resolves
               "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": {"app": "evil"}}}
    assert create_as(node, "eve", namespace, service)[0]
    created, said = create_as(node, "eve", namespace, evil)
    print(said)
    if created:  # admitted: a gang of its own (rank 0 is evil-0), which ends and is recorded on itself
        recorded = wait_for(lambda: trainhook_marks(statefulset(node, "evil", namespace)).get("trainhook.dev/phase"),
                            180, "evil's own outcome")
        assert recorded == "Succeeded"
    else:  # or refused at admission, naming why
        assert "vic1" in said, said
    victim = statefulset(node, "vic1", namespace)
    assert victim["spec"]["replicas"] == 2 and "trainhook.dev/phase" not in trainhook_marks(victim), victim["metadata"]
    pods = json.loads(node.kubectl("get", "pods", "-n", namespace, "-l", "app=vic1", "-o", "json"))["items"]
    assert sorted(p["metadata"]["name"] for p in pods if p["status"].get("phase") == "Running") == ["vic1-0", "vic1-1"]
    for i in range(2):
        lines = node.logs(namespace, f"vic1-{i}", "trainer").splitlines()
        assert lines.count("training") == 1, lines  # the training's own line: never stopped or restarted
