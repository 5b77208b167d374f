"""What kube-controller-manager and the apiserver do between `kubectl apply` and a pod: pure functions.

The StatefulSet and Job controllers turn an (admitted, mutated) workload into pod objects exactly as they would
post them to the apiserver: same names or generateName, labels, annotations, hostname, subdomain and owner
references. The apiserver then admits each pod, names it (generateName + 5 random characters) and stores it.
"""

from __future__ import annotations

import copy
import hashlib
import json
import random
import uuid
from dataclasses import dataclass

from trainhook.gang import keys
from trainhook.local.manifest import JOB, POD, STATEFULSET, describe, type_of

# Label the StatefulSet controller sets since Kubernetes 1.28 (keys.py explains why the webhook does not read it).
STATEFULSET_POD_INDEX = "apps.kubernetes.io/pod-index"
CONTROLLER_REVISION_HASH = "controller-revision-hash"
# Job pod labels: the legacy names and the batch.kubernetes.io/ ones (Kubernetes >= 1.27).
JOB_NAME_LABELS = ("job-name", "batch.kubernetes.io/job-name")
CONTROLLER_UID_LABELS = ("controller-uid", "batch.kubernetes.io/controller-uid")
# The env var the Job controller adds to every container of an Indexed Job's pods.
JOB_COMPLETION_INDEX_ENV = "JOB_COMPLETION_INDEX"

# The identities that create objects, as the webhook sees them in `request.userInfo`.
ADMIN_USER = {"username": "kubernetes-admin", "groups": ["kubeadm:cluster-admins", "system:authenticated"]}


def controller_user(name: str) -> dict:
    """The service account kube-controller-manager uses for one controller (`--use-service-account-credentials`)."""
    return {"username": f"system:serviceaccount:kube-system:{name}",
            "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, name)),
            "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"]}


class ControllerError(Exception):
    """A workload the controllers (or the apiserver's validation) would refuse; the message names the field."""


@dataclass(frozen=True)
class PodRequest:
    """A pod a controller (or the user, for a bare Pod) asks the apiserver to create, and who asks."""

    pod: dict
    user: dict


# The apiserver's alphabet for generated names (k8s.io/apimachinery/pkg/util/rand: no vowels, no look-alikes).
_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_MAX_GENERATE_BASE = 58  # 63 - 5 random characters


def generate_name(base: str, rng: random.Random | None = None) -> str:
    """The apiserver's SimpleNameGenerator: base (cut to 58 characters) plus 5 random characters."""
    rng = rng or random.Random()
    return base[:_MAX_GENERATE_BASE] + "".join(rng.choice(_NAME_ALPHABET) for _ in range(5))


def store(obj: dict, rng: random.Random | None = None) -> dict:
    """What the apiserver adds when it stores an admitted object: a generated name, a uid, a timestamp."""
    obj = copy.deepcopy(obj)
    meta = obj.get("metadata") or {}
    name = meta.get("name") or generate_name(meta.get("generateName", ""), rng)
    uid = meta.get("uid") or str(uuid.UUID(int=(rng or random.Random()).getrandbits(128), version=4))
    obj["metadata"] = {"name": name, **{k: v for k, v in meta.items() if k != "name"}, "uid": uid}
    return obj


def _template(workload: dict) -> dict:
    template = (workload.get("spec") or {}).get("template")
    if not isinstance(template, dict) or not isinstance(template.get("spec"), dict):
        raise ControllerError(f"{describe(workload)}: spec.template.spec is required")
    if not template["spec"].get("containers"):
        raise ControllerError(f"{describe(workload)}: spec.template.spec.containers must not be empty")
    return template


def _owner(workload: dict) -> dict:
    meta = workload["metadata"]
    return {"apiVersion": workload["apiVersion"], "kind": workload["kind"], "name": meta["name"],
            "uid": meta.get("uid", ""), "controller": True, "blockOwnerDeletion": True}


def _pod_from_template(workload: dict, template: dict) -> dict:
    """controller.GetPodFromTemplate: labels, annotations, finalizers and spec copied; owner reference set."""
    tmeta = template.get("metadata") or {}
    meta: dict = {"namespace": workload["metadata"]["namespace"],
                  "labels": dict(tmeta.get("labels") or {}),
                  "annotations": dict(tmeta.get("annotations") or {}),
                  "ownerReferences": [_owner(workload)]}
    if tmeta.get("finalizers"):
        meta["finalizers"] = list(tmeta["finalizers"])
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": copy.deepcopy(template["spec"])}


def _int_field(workload: dict, name: str, default: int) -> int:
    value = (workload.get("spec") or {}).get(name, default)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ControllerError(f"{describe(workload)}: spec.{name} must be a non-negative integer, not {value!r}")
    return value


def revision_hash(sts: dict) -> str:
    """A stable `controller-revision-hash` value for the template (the real one hashes a ControllerRevision)."""
    digest = hashlib.sha256(json.dumps(_template(sts), sort_keys=True).encode()).hexdigest()
    return f"{sts['metadata']['name']}-{digest[:10]}"


def statefulset_pods(sts: dict) -> list[dict]:
    """The pods `<sts>-<i>` the StatefulSet controller creates (newVersionedStatefulSetPod + updateIdentity)."""
    name = sts["metadata"]["name"]
    spec = sts.get("spec") or {}
    if not spec.get("serviceName"):
        # Optional since Kubernetes 1.32, but then pods get no subdomain and no stable address.
        raise ControllerError(f"{describe(sts)}: spec.serviceName is required to give pods stable addresses")
    template = _template(sts)
    revision = revision_hash(sts)
    pods = []
    for i in range(_int_field(sts, "replicas", 1)):
        pod = _pod_from_template(sts, template)
        pod_name = f"{name}-{i}"
        pod["metadata"]["name"] = pod_name
        labels = pod["metadata"]["labels"]
        labels[keys.STATEFULSET_POD_NAME] = pod_name
        labels[STATEFULSET_POD_INDEX] = str(i)
        labels[CONTROLLER_REVISION_HASH] = revision
        pod["spec"]["hostname"] = pod_name
        pod["spec"]["subdomain"] = spec["serviceName"]
        for claim in spec.get("volumeClaimTemplates") or []:
            claim_name = (claim.get("metadata") or {}).get("name")
            volumes = pod["spec"].setdefault("volumes", [])
            volumes[:] = [v for v in volumes if v.get("name") != claim_name]
            volumes.append({"name": claim_name,
                            "persistentVolumeClaim": {"claimName": f"{claim_name}-{pod_name}"}})
        pods.append(pod)
    return pods


def _add_completion_index_env(spec: dict) -> None:
    """The Job controller's addCompletionIndexEnvVariables: JOB_COMPLETION_INDEX in every container."""
    ref = {"fieldRef": {"fieldPath": f"metadata.annotations['{keys.JOB_COMPLETION_INDEX}']"}}
    for container in list(spec.get("initContainers") or []) + list(spec.get("containers") or []):
        env = container.setdefault("env", [])
        if not any(e.get("name") == JOB_COMPLETION_INDEX_ENV for e in env):
            env.append({"name": JOB_COMPLETION_INDEX_ENV, "valueFrom": copy.deepcopy(ref)})


def job_pods(job: dict) -> list[dict]:
    """The pods the Job controller creates: one per completion index for Indexed Jobs."""
    name = job["metadata"]["name"]
    uid = job["metadata"].get("uid", "")
    spec = job.get("spec") or {}
    template = _template(job)
    indexed = spec.get("completionMode", "NonIndexed") == "Indexed"
    if indexed and spec.get("completions") is None:
        raise ControllerError(f"{describe(job)}: spec.completions is required when completionMode is Indexed")
    completions = _int_field(job, "completions", 1)
    count = completions if indexed else min(_int_field(job, "parallelism", 1), completions)
    pods = []
    for i in range(count):
        pod = _pod_from_template(job, template)
        meta = pod["metadata"]
        for label in JOB_NAME_LABELS:
            meta["labels"][label] = name
        for label in CONTROLLER_UID_LABELS:
            meta["labels"][label] = uid
        if indexed:
            meta["generateName"] = f"{name}-{i}-"
            meta["annotations"][keys.JOB_COMPLETION_INDEX] = str(i)
            meta["labels"][keys.JOB_COMPLETION_INDEX] = str(i)
            pod["spec"]["hostname"] = f"{name}-{i}"
            _add_completion_index_env(pod["spec"])
        else:
            meta["generateName"] = f"{name}-"
        pods.append(pod)
    return pods


def job_warnings(job: dict) -> list[str]:
    """Where a cluster would behave differently from the local run, said once per Job."""
    spec = job.get("spec") or {}
    if spec.get("completionMode") != "Indexed":
        return []
    completions = _int_field(job, "completions", 1)
    parallelism = _int_field(job, "parallelism", 1)
    if parallelism < completions:
        return [f"{describe(job)}: parallelism {parallelism} < completions {completions}: a cluster runs only "
                f"{parallelism} pod(s) at a time, so a gang of {completions} would wait forever; running all "
                f"{completions} here"]
    return []


def pod_requests(workload: dict) -> list[PodRequest]:
    """The pod creations a controller sends for one stored workload, each with the controller's identity.

    A bare Pod has none: it was admitted as the user created it and is already a pod.
    """
    kind = type_of(workload)
    if kind == STATEFULSET:
        return [PodRequest(p, controller_user("statefulset-controller")) for p in statefulset_pods(workload)]
    if kind == JOB:
        return [PodRequest(p, controller_user("job-controller")) for p in job_pods(workload)]
    if kind == POD:
        return []
    raise ControllerError(f"{describe(workload)}: not a workload ({kind[0]} {kind[1]})")
