"""The webhook's side of the gang model: one member's place in its gang, and how admission words a problem.

The model itself (the shape, `role=count`, `min:max`, the lookup across workload and template) is
trainhook/gang/, shared with the launcher. Everything here is pure and validated up front. Parsers append to a
`Problems` list instead of raising, so a refusal lists every problem of the object in one answer (a user fixes
them all in one round trip).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache

from trainhook.gang import keys
from trainhook.gang import shape as model
# Shape's one copy is the gang model's (trainhook/gang/shape.py, shared with the launcher); re-exported here.
from trainhook.gang.shape import Shape, ShapeError

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class Problems(list[str]):
    """Every reason an object cannot work, each naming the key, the value and the fix."""

    def __init__(self) -> None:
        super().__init__()
        self.keys: list[str] = []  # the key of each problem, for the refusals-by-reason metric

    def add(self, key: str, value: object, why: str, fix: str) -> None:
        self.append(f"{key}={value!r}: {why}; {fix}")
        self.keys.append(key)


def at_most_one(shape: Shape, role: str, gang: str, problems: Problems, why: str = "") -> None:
    """Refuse a shape with more than one replica of a role its framework runs once (a master, a chief)."""
    if shape.count(role) > 1:
        reason = f"{gang} has at most one {role}" + (f" ({why})" if why else "")
        problems.add(keys.REPLICAS, str(shape), reason, f"set {role}=1 and put the other replicas in the worker role")


class Denied(Exception):
    """The object is labeled for trainhook but cannot work; carries every problem found."""

    def __init__(self, problems: Problems):
        super().__init__("; ".join(problems))
        self.problems = list(problems)
        self.keys = list(problems.keys)


# The most pods one gang may have. Why a limit: TensorFlow's TF_CONFIG, MXNet's MX_CONFIG and XGBoost's
# WORKER_ADDRS list every member, so a pod's review costs time and memory in the gang's size; an unbounded
# replica count (a typo, or a bare pod's annotation) made one review allocate without end. 10,000 pods is
# twice the nodes of the largest cluster Kubernetes supports, and keeps a 10,000-member TF_CONFIG (~0.5 MB)
# under etcd's object size limit.
MAX_GANG_SIZE = 10_000


def check_gang_size(size: int, key: str, value: object, problems: Problems) -> bool:
    """False (with the problem added) when a gang of `size` pods is more than the webhook admits."""
    if size <= MAX_GANG_SIZE:
        return True
    problems.add(key, value, f"a gang of {size} pods is more than trainhook admits ({MAX_GANG_SIZE})",
                 f"use at most {MAX_GANG_SIZE} pods in one gang")
    return False


def parse_shape(text: str, framework: str, problems: Problems) -> Shape | None:
    """Parse `role=count[,role=count]` (trainhook/gang/shape.py) as an annotation of a `framework` gang: its roles
    only, at most MAX_GANG_SIZE members; roles come back in the framework's rank order."""
    order = keys.ROLES.get(framework, ())
    try:
        shape = _ordered_shape(text, order)
    except ShapeError as e:
        why, fix = {
            model.ROLE: (f"{e.part!r} is not a {framework} role", f"use roles from {', '.join(order)}"),
            model.TWICE: (f"role {e.part!r} appears twice", "list each role once"),
            model.EMPTY: ("the gang has no replicas", "give at least one role a count >= 1"),
        }.get(e.kind, (f"cannot parse {e.part!r}", "write role=count pairs separated by commas, e.g. "
                                                    f"{order[0] if order else 'worker'}=1,worker=3"))
        problems.add(keys.REPLICAS, text, why, fix)
        return None
    if not check_gang_size(shape.size, keys.REPLICAS, text, problems):
        return None
    return shape


@lru_cache(maxsize=256)
def _ordered_shape(text: str, order: tuple[str, ...]) -> Shape:
    """`model.parse_shape` in the framework's rank order, remembered: every pod of a gang carries the same text,
    and a Shape is immutable (a ShapeError is raised again each time, never remembered)."""
    return model.parse_shape(text, order).in_order(order)


@dataclass(frozen=True)
class Member:
    """One pod's place in its gang: everything the environment builders need, and nothing from the API."""

    framework: str
    job_name: str
    namespace: str
    role: str
    index: int
    shape: Shape
    hosts: dict[str, str]  # role -> hostname prefix; peer i of the role is `<prefix>-<i>.<subdomain>`
    subdomain: str
    port: int
    options: dict[str, str] = field(default_factory=dict)  # the trainhook.dev/ annotations, by full key
    elastic: tuple[int, int] | None = None  # an elastic gang's min:max, parsed once (frameworks.elastic_range)

    @property
    def rank(self) -> int:
        return self.shape.first_rank(self.role) + self.index

    def address(self, role: str, index: int) -> str:
        """A pod's DNS name relative to the namespace, as the headless Service publishes it."""
        return f"{self.hosts[role]}-{index}.{self.subdomain}"

    @property
    def own_address(self) -> str:
        return self.address(self.role, self.index)

    def addresses(self, role: str) -> list[str]:
        return [self.address(role, i) for i in range(self.shape.count(role))]

    @property
    def all_addresses(self) -> list[str]:
        """Every member's address, in global rank order."""
        return [addr for role in self.shape.roles for addr in self.addresses(role)]

    @property
    def rank0_role(self) -> str:
        """The role of rank 0 (the gang's anchor: its workload is the one a record goes to first)."""
        return next(role for role, count in self.shape.counts if count > 0)

    @property
    def rank0_address(self) -> str:
        """Rank 0's address, without listing the gang (a 1024-pod gang costs what a 2-pod one does)."""
        return self.address(self.rank0_role, 0)

    def option(self, key: str, default: str = "") -> str:
        return self.options.get(key, default)

