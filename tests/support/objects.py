"""Builders for Kubernetes objects shaped as users write them and as the controllers create their pods.

Tests compare whole objects, so these builders are the single place the fixtures' shape lives.
"""

from __future__ import annotations

import copy
import uuid


def container(name: str = "trainer", gpus: int = 0, env: list | None = None) -> dict:
    c: dict = {"name": name, "image": "example.com/train:1", "command": ["torchrun", "/workspace/train.py"]}
    if gpus:
        c["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    if env is not None:
        c["env"] = env
    return c


def template(labels: dict, annotations: dict | None = None, containers: list | None = None) -> dict:
    meta: dict = {"labels": dict(labels)}
    if annotations:
        meta["annotations"] = dict(annotations)
    return {"metadata": meta, "spec": {"containers": containers or [container()]}}


def statefulset(name: str, replicas: int, labels: dict | None = None, annotations: dict | None = None,
                service: str | None = None, **template_kwargs) -> dict:
    labels = {"trainhook.dev/framework": "pytorch", **(labels or {})}
    meta: dict = {"name": name, "namespace": "team-a", "labels": labels}
    if annotations:
        meta["annotations"] = annotations
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": meta,
        "spec": {"serviceName": service if service is not None else name, "replicas": replicas,
                 "selector": {"matchLabels": {"app": name}},
                 "template": template({"app": name, **labels}, **template_kwargs)},
    }


def indexed_job(name: str, completions: int, labels: dict | None = None, annotations: dict | None = None,
                **template_kwargs) -> dict:
    labels = {"trainhook.dev/framework": "pytorch", **(labels or {})}
    meta: dict = {"name": name, "namespace": "team-a", "labels": labels}
    if annotations:
        meta["annotations"] = annotations
    tpl = template(labels, **template_kwargs)
    tpl["spec"]["restartPolicy"] = "Never"
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta,
            "spec": {"completions": completions, "parallelism": completions, "completionMode": "Indexed",
                     "template": tpl}}


def pod_of_statefulset(sts: dict, ordinal: int) -> dict:
    """The pod the StatefulSet controller would create (name, hostname, subdomain, owner)."""
    tpl = copy.deepcopy(sts["spec"]["template"])
    name = f"{sts['metadata']['name']}-{ordinal}"
    meta = tpl["metadata"]
    meta.update(name=name, namespace=sts["metadata"]["namespace"],
                ownerReferences=[{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": sts["metadata"]["name"],
                                  "uid": str(uuid.uuid5(uuid.NAMESPACE_DNS, name)), "controller": True,
                                  "blockOwnerDeletion": True}])
    meta["labels"]["statefulset.kubernetes.io/pod-name"] = name
    tpl["spec"].update(hostname=name, subdomain=sts["spec"]["serviceName"])
    return {"apiVersion": "v1", "kind": "Pod", **tpl}


def pod_of_job(job: dict, index: int) -> dict:
    """The pod the Job controller would create: generateName only, the completion index annotation."""
    tpl = copy.deepcopy(job["spec"]["template"])
    name = job["metadata"]["name"]
    meta = tpl["metadata"]
    meta.update(generateName=f"{name}-{index}-", namespace=job["metadata"]["namespace"],
                ownerReferences=[{"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": "job-uid",
                                  "controller": True, "blockOwnerDeletion": True}])
    meta.setdefault("annotations", {})["batch.kubernetes.io/job-completion-index"] = str(index)
    meta["labels"]["job-name"] = name
    return {"apiVersion": "v1", "kind": "Pod", **tpl}


def bare_pod(name: str, labels: dict, annotations: dict, **template_kwargs) -> dict:
    tpl = template({"trainhook.dev/framework": "pytorch", **labels}, annotations, **template_kwargs)
    tpl["metadata"].update(name=name, namespace="team-a")
    return {"apiVersion": "v1", "kind": "Pod", **tpl}


def service(name: str, **spec) -> dict:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": "team-a", "labels": {"trainhook.dev/job-name": name}},
            "spec": {"selector": {"trainhook.dev/job-name": name}, **spec}}


# Who creates a pod a StatefulSet or Job controls: kube-controller-manager's controller, under its own
# ServiceAccount (--use-service-account-credentials), as the webhook sees it in request.userInfo.
CONTROLLER_USERNAMES = {"StatefulSet": "system:serviceaccount:kube-system:statefulset-controller",
                        "Job": "system:serviceaccount:kube-system:job-controller"}
ADMIN_USERINFO = {"username": "kubernetes-admin", "groups": ["system:masters", "system:authenticated"]}


def creator_of(obj: dict) -> dict:
    """The userInfo of whoever creates `obj` on a cluster: a controlled pod's controller, else the admin."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    owner = next((ref.get("kind") for ref in refs if ref.get("controller")), None)
    if obj.get("kind") == "Pod" and owner in CONTROLLER_USERNAMES:
        return {"username": CONTROLLER_USERNAMES[owner],
                "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"]}
    return copy.deepcopy(ADMIN_USERINFO)


def review(obj: dict, operation: str = "CREATE", uid: str | None = None, old: dict | None = None,
           user: dict | None = None) -> dict:
    """An AdmissionReview as kube-apiserver sends it, from `user` (by default whoever creates `obj` on a cluster)."""
    kind = obj["kind"]
    group, _, version = obj["apiVersion"].rpartition("/")
    resource = {"Pod": "pods", "StatefulSet": "statefulsets", "Job": "jobs", "Service": "services"}.get(
        kind, kind.lower() + "s")
    return {
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": uid or str(uuid.uuid4()),
            "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": group, "version": version, "resource": resource},
            "requestKind": {"group": group, "version": version, "kind": kind},
            "requestResource": {"group": group, "version": version, "resource": resource},
            "name": obj["metadata"].get("name", ""), "namespace": obj["metadata"].get("namespace", "default"),
            "operation": operation,
            "userInfo": user or creator_of(obj),
            "object": obj, "oldObject": old, "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": f"{operation.title()}Options"},
        },
    }
