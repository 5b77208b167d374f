"""PyTorch: Kubeflow PyTorchJob's variables and torchrun's PET_* arguments (contract section 4)."""

from __future__ import annotations

import re

from trainhook import keys
from trainhook.webhook.gang import Member, Problems, Shape, at_most_one

ELASTIC_RANGE = re.compile(r"^(\d+):(\d+)$")


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


def parse_elastic(text: str) -> tuple[int, int] | None:
    """(min, max) of a `trainhook.dev/elastic` value, or None when it is not `min:max` with 1 <= min <= max."""
    match = ELASTIC_RANGE.match(text.strip())
    if not match or not 1 <= int(match[1]) <= int(match[2]):
        return None
    return int(match[1]), int(match[2])


def elastic_range(member: Member, problems: Problems) -> tuple[int, int] | None:
    """The `min:max` of an elastic gang, validated against its shape; None when the gang is not elastic."""
    text = member.option(keys.ELASTIC).strip()
    if not text:
        return None
    parsed = parse_elastic(text)
    if parsed is None:
        problems.add(keys.ELASTIC, text, "not an elastic range", "write min:max with 1 <= min <= max, e.g. 2:4")
    return parsed


def elastic_shape(shape: Shape, role: str, elastic: tuple[int, int]) -> Shape:
    """The shape an elastic gang may grow to: `role` extended so the gang has `max` members (never shrunk).

    Every pod of an elastic gang is wired with this one shape (TRAINHOOK_REPLICAS, the indices admitted),
    whatever the gang's size is at the moment, so scaling within min..max changes no pod's wiring and no
    template (the launcher's `gang.elastic_shape` reads it the same way)."""
    others = shape.size - shape.count(role)
    grown = max(shape.count(role), elastic[1] - others)
    return Shape(tuple((name, grown if name == role else count) for name, count in shape.counts))


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
    elastic = elastic_range(member, problems)
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
