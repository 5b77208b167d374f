"""PyTorch: Kubeflow PyTorchJob's variables and torchrun's PET_* arguments (contract section 4)."""

from __future__ import annotations

from trainhook.gang import keys
from trainhook.webhook.admission.member import Member, Problems, Shape, at_most_one

# A PyTorch gang may be elastic (`trainhook.dev/elastic: min:max`): torchrun's c10d rendezvous forms the world, so
# the gang may change size while it runs; its pods are wired for the range's maximum (frameworks.elastic_range).
# The launcher's table says the same (trainhook/gang/framework_rules.py).
ELASTIC = True


def nproc_per_node(member: Member, gpus: int, problems: Problems) -> tuple[str, int]:
    """PET_NPROC_PER_NODE and the factor WORLD_SIZE is multiplied by (Kubeflow: only an explicit integer).

    `auto` becomes the training container's GPU limit, or 1 without GPUs: torchrun's own `auto` would start one
    process per host CPU, which on a shared node is rarely what a pod was sized for.
    """
    value = member.option(keys.NPROC_PER_NODE, "auto").strip()
    if value == "auto":
        return str(gpus or 1), 1
    if value in keys.NPROC_WORDS:
        return value, 1
    if value.isdigit() and int(value) >= 1:
        return value, int(value)
    problems.add(keys.NPROC_PER_NODE, value, "not a process count",
                 "use auto, cpu, gpu or a positive integer")
    return "1", 1


def check_shape(shape: Shape, problems: Problems) -> None:
    at_most_one(shape, "master", "a PyTorch gang", problems)


def build_env(member: Member, gpus: int, problems: Problems) -> list[tuple[str, str]]:
    """Kubeflow PyTorchJob's variables. An elastic gang's pods get no WORLD_SIZE and RANK: its size changes
    while the pods run (kubectl scale, an HPA), so any number stamped at admission would be wrong after the
    next scale; torchrun's c10d rendezvous decides both and sets them for every worker process it starts."""
    nproc, factor = nproc_per_node(member, gpus, problems)
    check_shape(member.shape, problems)
    nodes = member.shape.size
    master, port = member.rank0_address, str(member.port)
    elastic = member.elastic
    env = [
        (keys.MASTER_ADDR, master),
        (keys.MASTER_PORT, port),
        *([] if elastic else [(keys.WORLD_SIZE, str(nodes * factor)), (keys.RANK, str(member.rank))]),
        (keys.PET_MASTER_ADDR, master),
        (keys.PET_MASTER_PORT, port),
        (keys.PET_NNODES, f"{elastic[0]}:{elastic[1]}" if elastic else str(nodes)),
        (keys.PET_NODE_RANK, str(member.rank)),
        (keys.PET_NPROC_PER_NODE, nproc),
        (keys.PYTHONUNBUFFERED, "1"),
    ]
    if elastic:
        env += [
            (keys.PET_RDZV_BACKEND, "c10d"),
            (keys.PET_RDZV_ENDPOINT, f"{master}:{port}"),
            (keys.PET_RDZV_ID, member.job_name),
            (keys.PET_MAX_RESTARTS, member.option(keys.MAX_RESTARTS, "3")),
        ]
    return env
