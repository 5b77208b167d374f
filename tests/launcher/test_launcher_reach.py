"""launcher/reach.py: a peer's name is asked once and its address reused while connects are refused, asked again
when the address may be stale; the launcher's connection to the coordinator (gang_link.Link) and the tcp gang wait
use it (issue 26: a 32-pod gang's members asked rank 0's name 3,342 times, once before every connect attempt).

Real sockets and a real coordinator on loopback; the lookup is a counting function standing in for the cluster
DNS (whose own counts the node's test, tests/e2e/test_e2e_gang_scale.py, asserts)."""

from __future__ import annotations

import queue
import socket
import time

import pytest

from test_gang_protocol import TOKEN, env, free_port, gang, next_directive
from trainhook.launcher import reach
from trainhook.launcher.coordination.coordinator import Coordinator
from trainhook.launcher.coordination.report import Report
from trainhook.launcher.pod_view import parse_gang
from trainhook.launcher.coordination.link import Link
from trainhook.launcher.policy import GangPolicy, read_settings


class CountingLookup:
    """name -> address, counting the questions; raises socket.gaierror (as NXDOMAIN does) until `published`."""

    def __init__(self, address: str = "127.0.0.1", published: bool = True):
        self.address, self.published, self.asked = address, published, []

    def __call__(self, name: str) -> str:
        self.asked.append(name)
        if not self.published:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return self.address


def refusing_port() -> tuple[socket.socket, int]:
    """A bound, not yet listening socket: connects to its port are refused until it listens."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock, sock.getsockname()[1]


def test_a_refused_peer_is_not_asked_again_and_a_lost_one_is():
    server, port = refusing_port()
    lookup = CountingLookup()
    peer = reach.PeerAddress("job-0.job", "ml.svc.cluster.local", lookup=lookup)
    try:
        for _ in range(5):  # the peer's process does not listen yet: same host, same address
            with pytest.raises(ConnectionRefusedError):
                reach.connect_peer(peer, port, 1.0)
        assert lookup.asked == ["job-0.job.ml.svc.cluster.local."]  # once, absolute
        server.listen()
        reach.connect_peer(peer, port, 1.0).close()
        assert len(lookup.asked) == 1
        peer.lost()  # a connection that was up went away: the pod may be new, with a new address
        reach.connect_peer(peer, port, 1.0).close()
        assert len(lookup.asked) == 2
    finally:
        server.close()


def test_an_address_that_stops_answering_or_ages_is_asked_again():
    now = [0.0]
    lookup = CountingLookup()
    peer = reach.PeerAddress("job-0.job", None, reuse_for=10.0, lookup=lookup, clock=lambda: now[0])
    assert peer.get() == "127.0.0.1" and peer.get() == "127.0.0.1" and len(lookup.asked) == 1
    now[0] = 10.0  # refused for REUSE_FOR: ask again, in case the refusals come from someone else's pod
    peer.get()
    assert len(lookup.asked) == 2
    peer.failed(socket.timeout("timed out"))  # no answer at all: the address may be gone
    peer.get()
    assert len(lookup.asked) == 3
    peer.failed(OSError(113, "No route to host"))
    peer.get()
    assert len(lookup.asked) == 4
    peer.failed(ConnectionRefusedError())  # a live host: keep it
    peer.get()
    assert len(lookup.asked) == 4


def test_a_name_not_published_yet_is_asked_on_each_attempt_and_then_kept():
    lookup = CountingLookup(published=False)
    peer = reach.PeerAddress("job-0.job", None, lookup=lookup)
    for _ in range(3):
        with pytest.raises(socket.gaierror):
            reach.connect_peer(peer, free_port(), 1.0)
    assert len(lookup.asked) == 3 and peer.address is None
    lookup.published = True
    server, port = refusing_port()
    with server:
        for _ in range(3):
            with pytest.raises(ConnectionRefusedError):
                reach.connect_peer(peer, port, 1.0)
    assert len(lookup.asked) == 4


def test_addresses_and_absolute_names_are_left_as_they_are():
    assert reach.qualified("10.244.0.7", "ml.svc.cluster.local") == "10.244.0.7"
    assert reach.qualified("fd00::7", "ml.svc.cluster.local") == "fd00::7"
    assert reach.qualified("job-0.job.ml.svc.cluster.local.", "ml.svc.cluster.local") == \
        "job-0.job.ml.svc.cluster.local."
    assert reach.qualified("job-0.job", "ml.svc.cluster.local") == "job-0.job.ml.svc.cluster.local."


def test_a_member_waiting_for_a_late_coordinator_asks_its_name_once():
    """The coordinator starts 2 s after the member's launcher: the member's Link retries (refused) on its
    backoff, reusing rank 0's address, then joins; when the coordinator goes, the member asks the name again."""
    port = free_port()
    settings = read_settings(env(TRAINHOOK_COORDINATOR_PORT=str(port)), parse_gang(env()))
    settings = settings.replace(key=TOKEN)
    lookup = CountingLookup()
    events: queue.SimpleQueue = queue.SimpleQueue()
    member = Link(gang(2, 1, address="g-0.g"), settings, events, Report())
    member.target.lookup = lookup
    member.start()
    coordinator = Coordinator(gang(2), GangPolicy(), TOKEN, port, log=lambda line: None)
    rank0 = Link(gang(2, 0), settings, queue.SimpleQueue(), Report())
    try:
        time.sleep(2.0)
        assert member.last_error.startswith("connection refused")
        assert lookup.asked == ["g-0.g"]  # no search domain outside a pod: the name as given, once
        coordinator.start()
        rank0.start()
        assert next_directive(events, "start", timeout=15)["attempt"] == 1
        assert lookup.asked == ["g-0.g"]
        coordinator.close()
        deadline = time.monotonic() + 10
        while len(lookup.asked) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(lookup.asked) == 2  # the connection was lost: rank 0 may come back elsewhere
    finally:
        member.close()
        rank0.close()
        coordinator.close()



def test_a_refusing_peer_is_retried_sooner_than_a_name_that_does_not_resolve():
    """A refusal costs no query and rank 0's coordinator is about to listen: retries every 0.1 s at most, not
    0.5 s; still jittered, and still slowing down with the time waited."""
    now = [0.0]
    backoff = reach.Backoff(0.5, clock=lambda: now[0], draw=lambda: 1.0)
    refused = reach.retry_floor(ConnectionRefusedError(), 0.5)
    unresolved = reach.retry_floor(socket.gaierror(socket.EAI_NONAME, "unknown"), 0.5)
    assert (refused, unresolved) == (reach.REFUSED_FLOOR, 0.5)
    assert max(backoff.next(unresolved) for _ in range(10)) == pytest.approx(0.5)
    assert backoff.next(refused) == pytest.approx(0.1)  # from 0.5 straight down to the lower cap
    now[0] = 60.0
    assert max(backoff.next(refused) for _ in range(10)) == pytest.approx(3.0)  # 5% of a minute


def test_the_jitter_is_uniform_in_its_bounds_without_the_random_module():
    """reach.draw stands in for random.random (a start does not import `random`): in [0, 1), spread over it."""
    draws = [reach.draw() for _ in range(4000)]
    assert all(0.0 <= d < 1.0 for d in draws)
    tenths = [sum(1 for d in draws if k / 10 <= d < (k + 1) / 10) for k in range(10)]
    assert min(tenths) > 300 and max(tenths) < 500, tenths  # ~400 each; a stuck or skewed draw fails
    spread = [reach.uniform(0.1, 5.0) for _ in range(1000)]
    assert all(0.1 <= s <= 5.0 for s in spread) and max(spread) - min(spread) > 4.0
