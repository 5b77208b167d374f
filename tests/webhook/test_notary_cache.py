"""What the notary remembers (webhook/notary/cache.py), on its own: the TokenReview answers' lifetimes and bounds,
the single-flight reads' sharing and freshness, and the token claims the notary reads as a hint
(notary_membership.token_claims). Time is a clock the test moves; the reads are real asyncio tasks. The rules
against a real API server (a recreated job, a deleted pod, a flood of tokens) are in test_notary_cache_cluster.py.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time

import pytest

from trainhook.webhook.notary.cache import EXPIRY_MARGIN, ReviewCache, SharedReads
from trainhook.webhook.notary.membership import token_claims

AUTHENTICATED = {"authenticated": True, "user": {"username": "system:serviceaccount:ns:sa"}}


class Clock:
    def __init__(self, wall: float = 1_700_000_000.0):
        self.now, self.wall_now = 0.0, wall

    def __call__(self) -> float:
        return self.now

    def wall(self) -> float:
        return self.wall_now

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.wall_now += seconds


def jwt(payload: object) -> str:
    def part(data: object) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")
    return f"{part({'alg': 'RS256'})}.{part(payload)}.c2lnbmF0dXJl"


def test_an_authenticated_answer_lives_until_shortly_before_the_token_expires_and_never_past_the_cap():
    clock = Clock()
    cache = ReviewCache(max_age=120, clock=clock, wall=clock.wall)
    cache.put("short", AUTHENTICATED, expires=clock.wall() + EXPIRY_MARGIN + 10)
    cache.put("long", AUTHENTICATED, expires=clock.wall() + 3600)
    cache.put("almost-expired", AUTHENTICATED, expires=clock.wall() + EXPIRY_MARGIN - 1)
    cache.put("no-exp", AUTHENTICATED, expires=None)  # a token that never expires: the API server decides each time
    assert cache.get("almost-expired") is None and cache.get("no-exp") is None
    assert cache.get("short") == AUTHENTICATED and cache.get("long") == AUTHENTICATED
    clock.advance(10.5)
    assert cache.get("short") is None  # EXPIRY_MARGIN before its exp
    assert cache.get("long") == AUTHENTICATED
    clock.advance(110)
    assert cache.get("long") is None  # the cap: 120 s after the review, whatever the token's exp


def test_refusals_are_not_kept_and_authenticated_answers_are_bounded():
    clock = Clock()
    cache = ReviewCache(size=4, clock=clock, wall=clock.wall)
    cache.put("member", AUTHENTICATED, expires=clock.wall() + 3600)
    for n in range(10_000):  # a flood of bogus tokens, or a member refused by an API server's hiccup
        cache.put(f"bogus-{n}", {"authenticated": False, "error": "invalid"}, expires=clock.wall() + 3600)
    assert len(cache) == 1 and cache.get("bogus-9999") is None
    assert cache.get("member") == AUTHENTICATED
    for n in range(10):
        cache.put(f"member-{n}", AUTHENTICATED, expires=clock.wall() + 3600)
    assert len(cache) == 4 and cache.get("member") is None  # the least recently used went first
    assert cache.get("member-9") == AUTHENTICATED


def test_expired_answers_do_not_linger_in_a_quiet_cache():
    clock = Clock()
    cache = ReviewCache(clock=clock, wall=clock.wall)
    for n in range(500):
        cache.put(f"burst-{n}", AUTHENTICATED, expires=clock.wall() + EXPIRY_MARGIN + 10)
    clock.advance(11)
    cache.put("later", AUTHENTICATED, expires=clock.wall() + 3600)  # the burst expired: dropped as it moves on
    assert len(cache) == 1
    cache.put("already-expired", AUTHENTICATED, expires=clock.wall() + EXPIRY_MARGIN)
    assert len(cache) == 1


def test_the_cache_keeps_digests_not_tokens():
    cache = ReviewCache()
    cache.put("secret-token-value", AUTHENTICATED, expires=time.time() + 3600)
    assert [len(key) for key in cache.authenticated.items] == [32]
    assert "secret-token-value" not in repr(cache.authenticated.items)


def test_concurrent_callers_share_one_read_and_later_ones_the_kept_copy():
    async def scenario():
        clock, reads = Clock(), 0
        shared = SharedReads(ttl=5, clock=clock)

        async def read():
            nonlocal reads
            reads += 1
            await asyncio.sleep(0.05)
            return {"read": reads}

        answers = await asyncio.gather(*(shared.get("gang", read) for _ in range(50)))
        assert reads == 1 and {a.value["read"] for a in answers} == {1}
        clock.advance(4.9)
        assert (await shared.get("gang", read)).value == {"read": 1}  # kept
        fresh = await shared.get("gang", read, fresh_after=clock())  # a caller that must judge on a new read
        assert reads == 2 and fresh.value == {"read": 2} and fresh.started >= clock()
        clock.advance(5.1)
        assert (await shared.get("gang", read)).value == {"read": 3}  # expired: read again
    asyncio.run(scenario())


def test_a_fresh_caller_joins_only_a_read_begun_after_its_request():
    async def scenario():
        clock, reads, release = Clock(), 0, asyncio.Event()
        shared = SharedReads(ttl=5, clock=clock)

        async def read():
            nonlocal reads
            reads += 1
            mine = reads
            await release.wait()
            return mine

        early = asyncio.ensure_future(shared.get("gang", read))
        await asyncio.sleep(0)
        clock.advance(1)
        began = clock()
        late = [asyncio.ensure_future(shared.get("gang", read, fresh_after=began)) for _ in range(5)]
        await asyncio.sleep(0)
        release.set()
        assert (await early).value == 1
        assert {(await f).value for f in late} == {2}  # one new read for the five, not the one begun earlier
        assert reads == 2
    asyncio.run(scenario())


def test_a_failed_read_is_not_kept_and_a_cancelled_caller_leaves_the_read_to_the_others():
    async def scenario():
        clock, calls = Clock(), []
        shared = SharedReads(ttl=5, clock=clock)

        async def failing():
            calls.append("failing")
            raise RuntimeError("API server unreachable")

        with pytest.raises(RuntimeError):
            await shared.get("gang", failing)
        assert len(shared) == 0 and not shared.flying

        async def slow():
            calls.append("slow")
            await asyncio.sleep(0.05)
            return "anchor"

        first = asyncio.ensure_future(shared.get("other", slow))
        second = asyncio.ensure_future(shared.get("other", slow))
        await asyncio.sleep(0)
        first.cancel()
        assert (await second).value == "anchor"
        assert calls == ["failing", "slow"] and len(shared) == 1 and not shared.flying
    asyncio.run(scenario())


def test_kept_reads_are_bounded():
    async def scenario():
        shared = SharedReads(ttl=60, size=8)

        async def read():
            return "x"

        for n in range(100):
            await shared.get(("gang", n), read)
        assert len(shared) == 8
        slow = SharedReads(ttl=0)  # a read slower than the lifetime: answered, and not kept
        assert (await slow.get("gang", read)).value == "x" and len(slow) == 0
    asyncio.run(scenario())


def test_token_claims_read_a_pod_bound_token_and_nothing_else():
    claims = token_claims(jwt({"aud": ["trainhook"], "exp": 1_700_003_600,
                               "kubernetes.io": {"namespace": "team-a", "pod": {"name": "ddp-0", "uid": "u"}}}))
    assert (claims.namespace, claims.pod, claims.audiences, claims.expires) == (
        "team-a", "ddp-0", ("trainhook",), 1_700_003_600.0)
    legacy = jwt({"kubernetes.io/serviceaccount/namespace": "team-a", "sub": "system:serviceaccount:team-a:x"})
    for token in ("not-a-token", "a.b.c", "a..c", "..", legacy, jwt([1, 2]), jwt({"kubernetes.io": "x"}),
                  jwt({"kubernetes.io": {"namespace": "team-a", "pod": {"name": 7}}}),
                  jwt({"kubernetes.io": {"namespace": "", "pod": {"name": "p"}}}), "a.\xff\xfe.c", "a.////.c"):
        assert token_claims(token) is None, token
    odd = token_claims(jwt({"aud": "trainhook", "exp": True, "kubernetes.io": {"namespace": "n", "pod": {"name": "p"}}}))
    assert odd.audiences == ("trainhook",) and odd.expires is None
