"""What the notary remembers between requests, so that a gang's N members starting together do not cost the API
server 4N calls (docs/develop/performance.md, "The notary at gang start"; docs/operate/security.md, "What the
notary caches").

- `ReviewCache`: authenticated TokenReview answers, keyed by the SHA-256 of the token (the token itself is not
  kept), until shortly before the token expires and at most MAX_REVIEW_AGE, at most MAX_REVIEWS of them (LRU).
  Refusals are not kept here (see `RefusalCache`). What a kept answer cannot vouch for is re-checked on every
  request: the pod the token names is read (its uid must be the token's), so a deleted pod's token is refused as
  before.
- `RefusalCache`: a token's refusal (401: not authenticated; 403: its pod is gone, recreated or in no gang), by
  the token's SHA-256, for REFUSAL_TTL seconds, at most MAX_REFUSALS (LRU): the same refused token sent again
  and again costs neither a verification nor a pod read (issue 31 item 3). Briefly, because a v1.20 TokenReview
  says "not authenticated" also when the API server failed to read the token's pod or ServiceAccount, and a
  member refused by such a hiccup must be asked about again soon; and it changes nothing for a member: the
  launcher takes a 401 or 403 as final. Decisions about the gang (its anchor, 503s) are never kept here.
- `SharedReads`: single-flight reads with a short lifetime. Concurrent callers that need the same read (a gang's
  anchor: rank 0's pod and its workload) share one API call; the result is kept for `ttl` seconds for callers
  that accept a recent copy, and a caller that must judge on data read after its own request began passes
  `fresh_after` (it then joins only a read that started since, or starts one).

- `RefusalLog`: which (pod, reason) refusals were logged already, so each is logged once and at a bounded rate.

Every structure is bounded by a count; the single-flight table holds only reads in flight (bounded by the
requests in flight, which the listener's connection cap bounds).
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("trainhook.webhook.notary")

MAX_REVIEW_AGE = 120.0  # seconds; Kubernetes' own webhook token cache keeps an answer 2 minutes by default
EXPIRY_MARGIN = 30.0  # an answer is dropped this long before its token expires
MAX_REVIEWS = 4096  # authenticated answers: one a member pod, about 2 KB each as dicts
REFUSAL_TTL = 5.0  # seconds a token's refusal is remembered
MAX_REFUSALS = 4096
ANCHOR_TTL = 5.0  # seconds a gang's anchor, once read, serves its members' credential calls
MAX_READS = 256  # gangs whose anchor is remembered: a pod and a workload each, up to about 80 KB as dicts


class _Expiring:
    """An LRU of values that expire (monotonic deadlines), at most `size` of them."""

    def __init__(self, size: int, clock: Callable[[], float]):
        self.size, self.clock = size, clock
        self.items: collections.OrderedDict[Hashable, tuple[float, Any]] = collections.OrderedDict()

    def get(self, key: Hashable) -> Any | None:
        item = self.items.get(key)
        if item is None:
            return None
        if item[0] <= self.clock():
            del self.items[key]
            return None
        self.items.move_to_end(key)
        return item[1]

    def put(self, key: Hashable, value: Any, deadline: float) -> None:
        """Keep `value` until `deadline`; the least recently used go first when over `size`, and expired ones at
        the old end are dropped as they are passed, so a quiet cache does not hold its last burst for hours."""
        self.items[key] = (deadline, value)
        self.items.move_to_end(key)
        now = self.clock()
        while self.items and (len(self.items) > self.size or next(iter(self.items.values()))[0] <= now):
            self.items.popitem(last=False)

    def __len__(self) -> int:
        return len(self.items)


class ReviewCache:
    """Authenticated TokenReview answers by the token's SHA-256, until shortly before the token expires (never
    longer than `max_age`), at most `size` of them."""

    def __init__(self, max_age: float = MAX_REVIEW_AGE, size: int = MAX_REVIEWS,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time):
        self.max_age, self.clock, self.wall = max_age, clock, wall
        self.authenticated = _Expiring(size, clock)

    @staticmethod
    def digest(token: str) -> bytes:
        return hashlib.sha256(token.encode()).digest()

    def get(self, token: str) -> dict | None:
        return self.authenticated.get(self.digest(token))

    def put(self, token: str, status: dict, expires: float | None) -> None:
        """Remember `status`, the review of `token`, if it authenticated the token; `expires` is the token's own
        `exp` (seconds since the epoch): the answer for a token without one (that never expires, or is not a
        JWT) is not kept, so nothing outlives what the API server itself would still accept."""
        if not status.get("authenticated") or expires is None:
            return
        age = min(self.max_age, expires - self.wall() - EXPIRY_MARGIN)
        if age > 0:
            self.authenticated.put(self.digest(token), status, self.clock() + age)

    def __len__(self) -> int:
        return len(self.authenticated)


class RefusalCache:
    """Refusals by the token's SHA-256, for `ttl` seconds, at most `size` of them (the module docstring)."""

    def __init__(self, ttl: float = REFUSAL_TTL, size: int = MAX_REFUSALS,
                 clock: Callable[[], float] = time.monotonic):
        self.ttl, self.clock = ttl, clock
        self.refused = _Expiring(size, clock)

    def get(self, token: str) -> Any | None:
        """A new exception like the one kept (never the same object: each raise would lengthen its traceback)."""
        kept = self.refused.get(ReviewCache.digest(token))
        if kept is None:
            return None
        kind, status, reason, who = kept
        again = kind(status, reason)
        again.who = who
        return again

    def put(self, token: str, refusal: Any) -> None:
        if refusal.status in (401, 403):
            self.refused.put(ReviewCache.digest(token), (type(refusal), refusal.status, refusal.reason, refusal.who),
                             self.clock() + self.ttl)

    def __len__(self) -> int:
        return len(self.refused)


@dataclass(frozen=True)
class Read:
    """A shared read's value and when the read began (monotonic): it shows the API's state as of then, or later."""

    value: Any
    started: float


class SharedReads:
    """Single-flight reads kept for `ttl` seconds (see the module docstring); at most `size` kept."""

    def __init__(self, ttl: float = ANCHOR_TTL, size: int = MAX_READS, clock: Callable[[], float] = time.monotonic):
        self.ttl, self.clock = ttl, clock
        self.kept = _Expiring(size, clock)
        self.flying: dict[Hashable, tuple[float, asyncio.Future]] = {}

    async def get(self, key: Hashable, read: Callable[[], Awaitable[Any]], fresh_after: float | None = None) -> Read:
        """The value of `read()` for `key`: a kept one (only when `fresh_after` is None), or one being read that
        began at or after `fresh_after`, or a new read. A read's error goes to every caller sharing it and is not
        kept. The read goes on when a caller is cancelled (the others still wait on it)."""
        if fresh_after is None:
            kept = self.kept.get(key)
            if kept is not None:
                return kept
        flying = self.flying.get(key)
        if flying is None or (fresh_after is not None and flying[0] < fresh_after):
            started = self.clock()
            task = asyncio.ensure_future(read())
            entry = flying = (started, task)
            self.flying[key] = entry
            task.add_done_callback(lambda _: self._landed(key, entry))
        value = await asyncio.shield(flying[1])
        return Read(value, flying[0])

    def _landed(self, key: Hashable, entry: tuple[float, asyncio.Future]) -> None:
        started, task = entry
        if self.flying.get(key) is entry:
            del self.flying[key]
        if task.cancelled() or task.exception() is not None:  # retrieved: no "never retrieved" warning
            return
        kept = self.kept.items.get(key)
        if kept is None or kept[1].started <= started:  # never replace a newer read with an older one
            self.kept.put(key, Read(task.result(), started), started + self.ttl)

    def forget(self, key: Hashable) -> None:
        self.kept.items.pop(key, None)

    def __len__(self) -> int:
        return len(self.kept)


class RefusalLog:
    """Logs each (pod, reason) refusal once, and at most `rate` new ones per second: a pod retrying, or a flood of
    forged requests, cannot fill the log."""

    def __init__(self, rate: float = 10.0, remember: int = 10_000):
        self.rate, self.remember = rate, remember
        self.seen: collections.OrderedDict[tuple[str, str], None] = collections.OrderedDict()
        self.allowance, self.last = rate, time.monotonic()
        self.suppressed = 0

    def refused(self, pod: str, status: int, reason: str) -> bool:
        """Log the refusal unless already logged or over the rate; True when it was logged."""
        key = (pod, reason)
        if key in self.seen:
            return False
        now = time.monotonic()
        self.allowance = min(self.rate, self.allowance + (now - self.last) * self.rate)
        self.last = now
        if self.allowance < 1:
            self.suppressed += 1
            return False
        self.allowance -= 1
        self.seen[key] = None
        while len(self.seen) > self.remember:
            self.seen.popitem(last=False)
        log.warning("notary refused", extra={"pod": pod, "status": status, "reason": reason,
                                             "suppressed": self.suppressed})
        self.suppressed = 0
        return True
