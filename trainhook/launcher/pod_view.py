"""This pod's gang, read from the TRAINHOOK_* variables the webhook injects (contract sections 3 and 4).

The launcher makes no API call: everything it needs to find its peers is in its own environment, so it works
the same under any RBAC and in the gang-wait init container before the pod has a service account token.
Parsing is pure (a mapping in, a `GangView` out, never changed after) and reports every bad variable at once, each
by name, so someone debugging a hand-written pod (or a webhook bug) sees the whole problem in one line.

`Peer` and `GangView` are plain classes, not dataclasses: every gang pod's launcher start imports this module, and
the dataclasses module (with the `inspect` it imports) was several ms of that start's CPU (issue 32).
"""

from __future__ import annotations


from trainhook.gang import keys
from trainhook.gang import shape as model
from trainhook.gang.shape import Shape, ShapeError
from trainhook.gang.framework_rules import is_elastic

TYPE_CHECKING = False  # typing's own, without importing typing (trainhook/launcher/__init__.py says why)
if TYPE_CHECKING:
    from typing import Any, Mapping


class ConfigError(Exception):
    """The environment or the command line cannot work. The CLI prints it as one line and exits 2.

    It carries every problem found, each naming the variable (or flag), its value and what is wrong, because a
    user who sees only the first problem needs one pod restart per mistake.
    """

    def __init__(self, problems: list[str] | str):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("; ".join(self.problems))


class Peer:
    """One member of the gang: where it sits (role, index, global rank) and the DNS name it answers on. A value:
    equal to a Peer of the same fields."""

    __slots__ = ("role", "index", "rank", "address")

    def __init__(self, role: str, index: int, rank: int, address: str):
        self.role, self.index, self.rank, self.address = role, index, rank, address

    def _fields(self) -> tuple[str, int, int, str]:
        return self.role, self.index, self.rank, self.address

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Peer) and self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return f"Peer(role={self.role!r}, index={self.index!r}, rank={self.rank!r}, address={self.address!r})"

    def __str__(self) -> str:
        return f"rank {self.rank} ({self.role}-{self.index} at {self.address})"


class GangView:
    """The whole gang as this pod sees it; `peers` is every member (this pod included) in global rank order."""

    __slots__ = ("framework", "job_name", "namespace", "role", "index", "rank", "peers", "subdomain", "address",
                 "port", "gang_wait", "gang_wait_port", "wait_timeout", "elastic")

    def __init__(self, framework: str, job_name: str, namespace: str, role: str, index: int, rank: int,
                 peers: tuple[Peer, ...], subdomain: str, address: str, port: int, gang_wait: str,
                 gang_wait_port: int, wait_timeout: float, elastic: tuple[int, int] | None = None):
        self.framework, self.job_name, self.namespace = framework, job_name, namespace
        self.role, self.index, self.rank, self.peers = role, index, rank, peers
        self.subdomain, self.address, self.port = subdomain, address, port
        self.gang_wait, self.gang_wait_port, self.wait_timeout = gang_wait, gang_wait_port, wait_timeout
        # PyTorch elastic (min, max) nodes, from PET_NNODES=min:max; None for a fixed-size gang. An elastic gang's
        # `peers` are every member it may have (max of them): which of them exist changes while it runs.
        self.elastic = elastic

    def replace(self, **changes: Any) -> GangView:
        """A copy with `changes` (keyword arguments of GangView), as dataclasses.replace made one."""
        return GangView(**{**{name: getattr(self, name) for name in GangView.__slots__}, **changes})

    @property
    def size(self) -> int:
        return len(self.peers)

    @property
    def assembled_at(self) -> int:
        """How many members the gang needs to start: all of them, or an elastic gang's min."""
        return self.elastic[0] if self.elastic else self.size

    @property
    def me(self) -> Peer:
        return self.peers[self.rank]

    @property
    def others(self) -> tuple[Peer, ...]:
        """Every member but this pod: the ones a barrier has to hear from."""
        return tuple(peer for peer in self.peers if peer.rank != self.rank)


class EnvProblems(list):  # of str; `list[str]` as a base needs Python 3.9
    """The problems found in the environment so far; unset variables are gathered into one entry, as they usually
    share one cause."""

    def __init__(self) -> None:
        super().__init__()
        self.unset: list[str] = []

    def missing(self, name: str) -> None:
        self.unset.append(name)

    def all(self) -> list[str]:
        if not self.unset:
            return list(self)
        return [f"not set: {', '.join(self.unset)} (the trainhook webhook injects these into pods labeled "
                f"{keys.FRAMEWORK}; is the pod labeled, and does the webhook's objectSelector match it?)", *self]


def parse_pairs(name: str, text: str, problems: list[str]) -> list[tuple[str, str]] | None:
    """Parse `key=value[,key=value]` keeping the order (TRAINHOOK_REPLICAS is in rank order); None on error."""
    try:
        return model.split_pairs(text)
    except ShapeError as e:
        problems.append(shape_problem(name, text, e))
        return None


def shape_problem(name: str, text: str, error: ShapeError) -> str:
    """The launcher's words for a TRAINHOOK_* value the gang model does not parse (trainhook/gang/shape.py)."""
    why = {model.TWICE: f"role {error.part!r} appears twice",
           model.COUNT: "counts must be non-negative integers",
           model.EMPTY: "the gang has no members"}.get(
        error.kind, f"cannot parse {error.part!r}; expected role=value[,role=value]")
    return f"{name}={text!r}: {why}"


def parse_number(env: Mapping[str, str], name: str, default: float | None, low: float, high: float,
                 problems: list[str], integer: bool = True) -> float | None:
    """A numeric variable within [low, high], or `default` when unset (None default: required, and then
    `problems` must be an `EnvProblems`); None, with the reason in `problems`, when it is malformed."""
    text = env.get(name, "").strip()
    if not text:
        if default is None:
            assert isinstance(problems, EnvProblems), "a required variable needs an EnvProblems"
            problems.missing(name)
        return default
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        problems.append(f"{name}={text!r}: not {'an integer' if integer else 'a number'}")
        return None
    if not low <= value <= high:
        problems.append(f"{name}={text!r}: out of range {low:g}..{high:g}")
        return None
    return value


def _shape(env: Mapping[str, str], problems: EnvProblems) -> Shape | None:
    """TRAINHOOK_REPLICAS, in the order given (the webhook writes it in rank order)."""
    text = env.get(keys.TH_REPLICAS, "").strip()
    if not text:
        problems.missing(keys.TH_REPLICAS)
        return None
    try:
        return model.parse_shape(text)
    except ShapeError as e:
        problems.append(shape_problem(keys.TH_REPLICAS, text, e))
        return None


def build_peers(shape: Shape, hosts: Mapping[str, str], subdomain: str) -> tuple[Peer, ...]:
    """Every member in global rank order: roles in the order given, indexes ascending (Kubeflow's ranking)."""
    peers: list[Peer] = []
    for role, count in shape.counts:
        for index in range(count):
            peers.append(Peer(role, index, len(peers), f"{hosts[role]}-{index}.{subdomain}"))
    return tuple(peers)


def elastic_range(env: Mapping[str, str], framework: str, problems: list[str]) -> tuple[int, int] | None:
    """(min, max) of a PyTorch elastic gang; None for a fixed-size gang. TRAINHOOK_ELASTIC says it in every
    container the webhook wires (the gang wait has no PET_* variables); a training container without it (a
    webhook before it) still has PET_NNODES=min:max beside the c10d rendezvous variables."""
    name, text = keys.TH_ELASTIC, env.get(keys.TH_ELASTIC, "").strip()
    if not text and env.get(keys.PET_RDZV_BACKEND, "").strip() and ":" in env.get(keys.PET_NNODES, ""):
        name, text = keys.PET_NNODES, env.get(keys.PET_NNODES, "").strip()
    if not is_elastic(framework) or not text:
        return None
    try:
        return model.parse_range(text)
    except ShapeError:
        problems.append(f"{name}={text!r}: not an elastic range min:max with 1 <= min <= max "
                        f"(the {keys.ELASTIC} annotation)")
        return None


def elastic_shape(shape: Shape, elastic: tuple[int, int]) -> Shape:
    """The shape an elastic gang may grow to: its last role (the workers) extended so the gang has `max`
    members. The stamped shape is the size it was created with; a scale within min..max never re-stamps it
    (the scale subresource carries no template), so the launcher counts peers up to max instead."""
    return model.elastic_shape(shape, shape.roles[-1], elastic)


def parse_gang(env: Mapping[str, str]) -> GangView:
    """Read the gang from the TRAINHOOK_* variables; raise ConfigError listing every missing or bad one."""
    problems = EnvProblems()

    def required(name: str) -> str:
        value = env.get(name, "").strip()
        if not value:
            problems.missing(name)
        return value

    framework = required(keys.TH_FRAMEWORK)
    if framework and framework not in keys.ROLES:
        problems.append(f"{keys.TH_FRAMEWORK}={framework!r}: not a framework trainhook knows "
                        f"({', '.join(keys.ROLES)})")
    job_name, namespace = required(keys.TH_JOB_NAME), required(keys.TH_NAMESPACE)
    role, subdomain = required(keys.TH_ROLE), required(keys.TH_SUBDOMAIN)
    index = parse_number(env, keys.TH_INDEX, None, 0, 1 << 31, problems)
    shape = _shape(env, problems)
    hosts_text = required(keys.TH_HOSTS)
    hosts = dict(parse_pairs(keys.TH_HOSTS, hosts_text, problems) or []) if hosts_text else {}
    port = parse_number(env, keys.TH_PORT, keys.DEFAULT_PORT.get(framework, 0), 0, 65535, problems)
    gang_wait = env.get(keys.TH_GANG_WAIT, "").strip() or "dns"
    if gang_wait not in keys.GANG_WAIT_MODES:
        problems.append(f"{keys.TH_GANG_WAIT}={gang_wait!r}: use one of {', '.join(keys.GANG_WAIT_MODES)}")
    wait_port = parse_number(env, keys.TH_GANG_WAIT_PORT, keys.GANG_WAIT_PORT, 1, 65535, problems)
    timeout = parse_number(env, keys.TH_WAIT_TIMEOUT, 600.0, 0.0, 1e9, problems, integer=False)
    elastic = elastic_range(env, framework, problems)

    rank = -1
    if shape is not None and elastic is not None:
        grown = elastic_shape(shape, elastic)
        if role and index is not None and grown.count(role) and index >= grown.count(role):
            problems.append(f"{keys.TH_INDEX}={env.get(keys.TH_INDEX)!r}: this pod is beyond the elastic gang's "
                            f"maximum of {elastic[1]} members ({keys.ELASTIC}={elastic[0]}:{elastic[1]}); scale the "
                            f"workload to at most {grown.count(role)} {role} replicas, or raise the maximum")
            index = None  # said once, here, rather than again as "role has only N members"
        shape = grown
    if shape is not None:
        counts = dict(shape.counts)
        if hosts_text and hosts:
            for name in [r for r, count in shape.counts if count and r not in hosts]:
                problems.append(f"{keys.TH_HOSTS}={hosts_text!r}: no hostname prefix for role {name!r}, "
                                f"which has members in {keys.TH_REPLICAS}")
        if role and not counts.get(role):
            problems.append(f"{keys.TH_ROLE}={role!r}: not a role with members in "
                            f"{keys.TH_REPLICAS}={env.get(keys.TH_REPLICAS)!r}")
        elif role and index is not None and index >= counts[role]:
            problems.append(f"{keys.TH_INDEX}={env.get(keys.TH_INDEX)!r}: role {role!r} has only "
                            f"{counts[role]} member(s) in {keys.TH_REPLICAS}")
        elif role and index is not None:
            rank = shape.rank(role, int(index))
            given = env.get(keys.TH_RANK, "").strip()
            if given and given != str(rank):
                problems.append(f"{keys.TH_RANK}={given!r}: {role}-{index} has rank {rank} in "
                                f"{keys.TH_REPLICAS}={env.get(keys.TH_REPLICAS)!r}")
    if problems.all():
        raise ConfigError(problems.all())
    assert shape is not None and index is not None and port is not None and wait_port is not None
    peers = build_peers(shape, hosts, subdomain)
    address = env.get(keys.TH_ADDRESS, "").strip() or peers[rank].address
    return GangView(framework=framework, job_name=job_name, namespace=namespace, role=role, index=int(index),
                rank=rank, peers=peers, subdomain=subdomain, address=address, port=int(port),
                gang_wait=gang_wait, gang_wait_port=int(wait_port), wait_timeout=float(timeout or 0.0),
                elastic=elastic)
