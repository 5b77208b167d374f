"""A gang's shape: roles and replica counts in rank order, parsed from `role=count[,role=count]`, and an elastic
gang's `min:max` range.

The parsers raise `ShapeError` naming what is wrong (`kind`, `part`); each caller words the message for its
reader (the webhook's refusal names the annotation and the fix, the launcher's the TRAINHOOK_* variable), so the
rules are one and the messages stay where their readers are.

Part of the launcher's start in every gang pod (launcher/deliver.py), so no dataclasses: importing them (and the
`inspect` they import) cost a start ~7 ms of CPU (issue 32).
"""

from __future__ import annotations

import re

TYPE_CHECKING = False  # typing's own, without importing typing (trainhook/launcher/__init__.py says why)
if TYPE_CHECKING:
    from typing import Sequence

ELASTIC_RANGE = r"^(\d+):(\d+)$"  # compiled on first use (re's cache): a launcher's start seldom needs it

# ShapeError kinds: a part that is not `name=value`; a count that is not a non-negative integer; a role the
# framework does not have; a role written twice; a gang of no members; a range that is not `min:max`.
SYNTAX, COUNT, ROLE, TWICE, EMPTY, RANGE = "syntax", "count", "role", "twice", "empty", "range"


class ShapeError(ValueError):
    """Why a shape or range does not parse: `kind` (one of the kinds above) and the `part` (or role) at fault."""

    def __init__(self, kind: str, part: str = ""):
        super().__init__(f"{kind}: {part!r}")
        self.kind = kind
        self.part = part


class Shape:
    """The gang's roles and replica counts, in rank order (master/chief first, as Kubeflow ranks them). A value:
    equal to a Shape of the same counts, and never changed once made (the webhook shares the ones it caches)."""

    __slots__ = ("counts",)

    def __init__(self, counts: tuple[tuple[str, int], ...]):
        self.counts = counts

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Shape) and self.counts == other.counts

    def __hash__(self) -> int:
        return hash(self.counts)

    def __repr__(self) -> str:
        return f"Shape(counts={self.counts!r})"

    @property
    def roles(self) -> tuple[str, ...]:
        return tuple(role for role, _ in self.counts)

    @property
    def size(self) -> int:
        return sum(count for _, count in self.counts)

    def count(self, role: str) -> int:
        return dict(self.counts).get(role, 0)

    def first_rank(self, role: str) -> int:
        """The global rank of index 0 of `role`: the sizes of the roles ranked before it."""
        rank = 0
        for name, count in self.counts:
            if name == role:
                return rank
            rank += count
        raise KeyError(role)

    def rank(self, role: str, index: int) -> int:
        """The global rank of member `index` of `role` (Kubeflow's ranking: roles in order, indexes ascending)."""
        return self.first_rank(role) + index

    def in_order(self, order: Sequence[str]) -> Shape:
        """The same counts with the roles sorted by `order` (a framework's rank order); unknown roles first."""
        return Shape(tuple(sorted(self.counts, key=lambda item: order.index(item[0]) if item[0] in order else 0)))

    def __str__(self) -> str:
        return ",".join(f"{role}={count}" for role, count in self.counts)


def split_pairs(text: str) -> list[tuple[str, str]]:
    """`name=value[,name=value]` as (name, value) pairs in the order written (TRAINHOOK_HOSTS, and the first step
    of a shape); raises ShapeError SYNTAX for a part without a name or a value, TWICE for a name written twice."""
    pairs: list[tuple[str, str]] = []
    for part in text.split(","):
        name, sep, value = (s.strip() for s in part.partition("="))
        if not sep or not name or not value:
            raise ShapeError(SYNTAX, part.strip())
        if name in dict(pairs):
            raise ShapeError(TWICE, name)
        pairs.append((name, value))
    return pairs


def parse_shape(text: str, roles: Sequence[str] = ()) -> Shape:
    """`role=count[,role=count]` as a Shape, in the order written (`Shape.in_order` sorts it).

    Each part is checked in turn: SYNTAX (no `=`, no role, no count), COUNT (not a non-negative integer), ROLE
    (not one of `roles`, when given), TWICE; then EMPTY when the counts add up to no member."""
    counts: list[tuple[str, int]] = []
    for part in text.split(","):
        role, sep, count = (s.strip() for s in part.partition("="))
        if not sep or not role or not count:
            raise ShapeError(SYNTAX, part.strip())
        if not count.isdigit():
            raise ShapeError(COUNT, part.strip())
        if roles and role not in roles:
            raise ShapeError(ROLE, role)
        if role in dict(counts):
            raise ShapeError(TWICE, role)
        counts.append((role, int(count)))
    shape = Shape(tuple(counts))
    if shape.size < 1:
        raise ShapeError(EMPTY, text)
    return shape


def size_of(text: str) -> int:
    """The members of a `role=count` list; 0 when it does not parse (for readers that only show a shape)."""
    try:
        return parse_shape(text).size
    except ShapeError:
        return 0


def parse_range(text: str) -> tuple[int, int]:
    """(min, max) of a `min:max` elastic range (`trainhook.dev/elastic`, TRAINHOOK_ELASTIC); raises ShapeError
    RANGE unless it is two integers with 1 <= min <= max."""
    match = re.match(ELASTIC_RANGE, text.strip())
    if not match or not 1 <= int(match[1]) <= int(match[2]):
        raise ShapeError(RANGE, text)
    return int(match[1]), int(match[2])


def elastic_shape(shape: Shape, role: str, elastic: tuple[int, int]) -> Shape:
    """The shape an elastic gang may grow to: `role` extended so the gang has `max` members (never shrunk).

    Every pod of an elastic gang is wired with this one shape (TRAINHOOK_REPLICAS, the indices admitted), whatever
    the gang's size is at the moment, so scaling within min..max changes no pod's wiring and no template."""
    others = shape.size - shape.count(role)
    grown = max(shape.count(role), elastic[1] - others)
    return Shape(tuple((name, grown if name == role else count) for name, count in shape.counts))
