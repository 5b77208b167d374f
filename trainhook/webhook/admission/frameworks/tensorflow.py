"""TensorFlow: Kubeflow TFJob's TF_CONFIG (contract section 4).

The JSON is the one kubeflow/training-operator's TFJob controller writes (pkg/controller.v1/tensorflow/
tensorflow.go, `genTFConfigJSONStr` and `genClusterSpec`), byte for byte apart from the addresses:

    {"cluster":{"chief":[...],"evaluator":[...],"ps":[...],"worker":[...]},
     "task":{"type":"worker","index":0},"environment":"cloud"}

- every role of the gang is a key of `cluster` (the evaluator included), roles sorted by name as Go's
  encoding/json sorts map keys, each role's addresses in index order;
- an address is `<hostname>.<subdomain>:<port>` (contract section 3) where Kubeflow writes
  `<job>-<role>-<i>.<namespace>.svc:<port>`; both resolve to the same pod from inside the namespace;
- a gang of exactly one pod gets no TF_CONFIG, as a TFJob with one replica gets none (Kubeflow's
  `isDistributed`, issue kubeflow/training-operator#1078): TensorFlow then trains locally instead of starting a
  gRPC server for a cluster of one.

`cluster_spec` and `tf_config` are pure and shared with `trainhook-launch tf-config`, so the launcher prints
exactly what the webhook injects: they live on the launcher's side (trainhook.gang.wiring), which runs on an
image's Python with the standard library only, and are imported here.
"""

from __future__ import annotations

from trainhook.gang import keys
from trainhook.gang.wiring import TF_CONFIG, cluster_spec, tf_config
from trainhook.webhook.admission.frameworks import MAX_LISTED_MEMBERS, check_listed_length, check_listed_size
from trainhook.webhook.admission.member import Member, Problems, Shape

# Roles TensorFlow allows at most one task of (its multi_worker_util._validate_cluster_spec refuses more).
SINGLE_TASK_ROLES = ("chief", "master", "evaluator")


def is_distributed(shape: Shape) -> bool:
    """Kubeflow's rule: TF_CONFIG only when the gang is not exactly one pod."""
    return shape.size != 1


def check_shape(shape: Shape, problems: Problems) -> None:
    """Shapes TensorFlow (and Kubeflow's TFJob validation) cannot run, each with the fix."""
    text = str(shape)
    if shape.count("chief") and shape.count("master"):
        problems.add(keys.REPLICAS, text, "a TensorFlow gang has a chief or a master, not both (they are the "
                     "same task to TensorFlow)", "keep one of the two roles")
    for role in SINGLE_TASK_ROLES:
        if shape.count(role) > 1:
            problems.add(keys.REPLICAS, text, f"TensorFlow allows at most one {role} task",
                         f"set {role}=1 and put the other replicas in the worker role")
    if is_distributed(shape):
        check_listed_size(shape, TF_CONFIG, "tensorflow", problems)
    if shape.count("ps") and not (shape.count("chief") or shape.count("master") or shape.count("worker")):
        problems.add(keys.REPLICAS, text, "parameter servers with no chief or worker to train",
                     "add chief=1 (the ParameterServerStrategy coordinator) and workers")


def build_env(member: Member, gpus: int, problems: Problems) -> list[tuple[str, str]]:
    check_shape(member.shape, problems)
    if not is_distributed(member.shape) or member.shape.size > MAX_LISTED_MEMBERS:
        return []
    addresses = {role: member.addresses(role) for role in member.shape.roles}
    value = tf_config(cluster_spec(addresses, member.port), member.role, member.index)
    return [(TF_CONFIG, value)] if check_listed_length(TF_CONFIG, value, problems) else []
