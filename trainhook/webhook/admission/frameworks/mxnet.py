"""MXNet: Kubeflow MXJob's MX_CONFIG and DMLC_* variables (wiring only: MXNet is retired upstream).

Kubeflow's reference is `SetPodEnv` in kubeflow/training-operator pkg/controller.v1/mxnet/mxnet.go (v1.8,
the last release with MXJob): MX_CONFIG (a JSON cluster spec), DMLC_PS_ROOT_PORT and DMLC_PS_ROOT_URI (the
scheduler, `<job>-scheduler-0`), DMLC_NUM_SERVER, DMLC_NUM_WORKER, DMLC_ROLE, DMLC_USE_KUBERNETES=1 and, on
workers only, DMLC_WORKER_ID (the pod's index, for BytePS). Without a scheduler Kubeflow writes an empty URI
and port 0, and so does this.

Differences: addresses are `<host>.<subdomain>`; every role uses the gang's one port (Kubeflow reads each
role's `mxjob-port` container port, 9091 unless changed); MX_CONFIG's "labels" are empty strings (Kubeflow
copies each role's `tuner-server-key` template annotation, used only by its TVM tuner roles, which are not
trainhook roles).
"""

from __future__ import annotations

import json

from trainhook.webhook.admission.frameworks import MAX_LISTED_MEMBERS, check_listed_length, check_listed_size
from trainhook.webhook.admission.member import Member, Problems, Shape

MX_CONFIG = "MX_CONFIG"
DMLC_PS_ROOT_PORT = "DMLC_PS_ROOT_PORT"
DMLC_PS_ROOT_URI = "DMLC_PS_ROOT_URI"
DMLC_NUM_SERVER = "DMLC_NUM_SERVER"
DMLC_NUM_WORKER = "DMLC_NUM_WORKER"
DMLC_ROLE = "DMLC_ROLE"
DMLC_USE_KUBERNETES = "DMLC_USE_KUBERNETES"
DMLC_WORKER_ID = "DMLC_WORKER_ID"


def mx_config(member: Member) -> str:
    """MX_CONFIG as Go's json.Marshal writes Kubeflow's MXConfig: struct fields in order, map keys sorted."""
    roles = sorted(member.shape.roles)
    config = {
        "cluster": {role: [{"url": addr, "port": member.port} for addr in member.addresses(role)] for role in roles},
        "labels": {role: "" for role in roles},
        "task": {"type": member.role, "index": member.index},
    }
    return json.dumps(config, separators=(",", ":"))


def check_shape(shape: Shape, problems: Problems) -> None:
    """MX_CONFIG lists every member in every pod: at most MAX_LISTED_MEMBERS (frameworks/__init__.py says why)."""
    check_listed_size(shape, MX_CONFIG, "mxnet", problems)


def build_env(member: Member, gpus: int, problems: Problems) -> list[tuple[str, str]]:
    check_shape(member.shape, problems)
    if member.shape.size > MAX_LISTED_MEMBERS:
        return []
    config = mx_config(member)
    check_listed_length(MX_CONFIG, config, problems)
    has_scheduler = member.shape.count("scheduler") > 0
    env = [
        (MX_CONFIG, config),
        (DMLC_PS_ROOT_PORT, str(member.port) if has_scheduler else "0"),
        (DMLC_PS_ROOT_URI, member.address("scheduler", 0) if has_scheduler else ""),
        (DMLC_NUM_SERVER, str(member.shape.count("server"))),
        (DMLC_NUM_WORKER, str(member.shape.count("worker"))),
        (DMLC_ROLE, member.role),
        (DMLC_USE_KUBERNETES, "1"),
    ]
    if member.role == "worker":
        env.append((DMLC_WORKER_ID, str(member.index)))
    return env
