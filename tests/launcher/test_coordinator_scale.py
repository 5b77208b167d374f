"""The coordinator at a gang's scale (issue 32): no member holds up the others' decisions, and the barrier's and the
delivery's bookkeeping stay O(1) per event however many members there are.

Before issue 32 each decision was written to every member's socket (sendall) with the gang's lock held: a member
whose launcher stopped reading (stuck, swapped out, a slow node) filled its socket buffer, the write blocked, and
with it every other member's join and report. The first test is that member, for real on loopback."""

from __future__ import annotations

import queue
import socket
import threading
import time

from test_gang_protocol import TOKEN, env, free_port, gang, next_directive
from trainhook.launcher import wire
from trainhook.launcher.coordination import coordinator_rules
from trainhook.launcher.coordination.coordinator import OUT_LIMIT, Coordinator
from trainhook.launcher.coordination.coordinator_rules import CoordinatorState
from trainhook.launcher.coordination.link import Link
from trainhook.launcher.coordination.report import EXITED, RUNNING, Report
from trainhook.launcher.pod_view import parse_gang
from trainhook.launcher.policy import RESTART_GANG, GangPolicy, read_settings


def joined_by_hand(port: int, rank: int) -> wire.Channel:
    """A member's handshake done by hand (what link.Link does), leaving a channel this test reads only if it likes;
    its receive buffer small, so that what it does not read backs up to the coordinator soon."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(5)
    sock.connect(("127.0.0.1", port))
    nonce = wire.new_nonce()
    wire.send_plain(sock, wire.member_greeting("ns", "g", rank, nonce))
    reader = wire.LineReader(sock)
    answer = reader.read()
    assert answer is not None and "nonce" in answer, answer
    channel = wire.Channel(sock, reader, TOKEN, "member", answer["nonce"], nonce)
    channel.send({"type": "join", "rank": rank, "report": Report().to_dict()})
    assert channel.receive()["type"] == "welcome"
    return channel


def test_a_member_that_stops_reading_holds_up_no_other_member_and_is_dropped():
    port = free_port()
    lines: list[str] = []
    coordinator = Coordinator(gang(3), GangPolicy(RESTART_GANG, 3), TOKEN, port, log=lines.append)
    coordinator.start()
    settings = read_settings(env(TRAINHOOK_COORDINATOR_PORT=str(port)), parse_gang(env()))
    settings = settings.replace(key=TOKEN)

    def link(rank: int, report: Report) -> tuple[Link, queue.SimpleQueue]:
        events: queue.SimpleQueue = queue.SimpleQueue()
        member = Link(gang(3, rank), settings, events, report)
        member.start()
        links.append((member, events))
        return member, events

    links: list = []
    stalled = joined_by_hand(port, 2)
    try:
        link(0, Report())
        link(1, Report())
        assert stalled.receive()["type"] == "start"
        # Rank 1's training is killed: the gang restarts, and every member running attempt 1 is told to stop.
        links[1][0].update(Report(attempt=1, status=EXITED, code=137))
        next_directive(links[0][1], "stop")
        # Rank 2 stops reading, while it claims, again and again, to still run attempt 0: the coordinator answers
        # each claim with a `stop` that nobody reads. Sent from a thread: the coordinator goes on reading them.
        claim = Report(attempt=0, status=RUNNING).to_dict()

        def flood() -> None:
            try:
                for _ in range(OUT_LIMIT // 50):  # 19 MB of stops: well over OUT_LIMIT and the kernel's buffers
                    stalled.send({"type": "state", "report": claim})
            except OSError:
                pass  # dropped by the coordinator: what this test waits for
        flooder = threading.Thread(target=flood, daemon=True)
        flooder.start()
        # It ends when the coordinator drops rank 2, or (before issue 32) when the coordinator, blocked writing to
        # rank 2, stopped reading it (the flood's send then times out).
        flooder.join(60)
        # Rank 1's launcher restarts and joins again: before issue 32 its join waited for the gang's lock, held by
        # a write to rank 2 that never ended.
        links[1][0].close()
        started = time.monotonic()
        _, events = link(1, Report(attempt=1, status=EXITED, code=137))
        next_directive(events, "welcome", timeout=5)
        assert time.monotonic() - started < 5
        assert any("dropped the connection of rank 2" in line and "read none of the last" in line
                   for line in lines), lines[-5:]
        assert coordinator.threads() == 1
    finally:
        for member, _ in links:
            member.close()
        stalled.close()
        coordinator.close()


class CountingList(list):
    """The gang's records, counting every look at one (what the barrier's check costs)."""

    looks = 0

    def __getitem__(self, index):
        CountingList.looks += 1
        return super().__getitem__(index)

    def __iter__(self):
        for item in super().__iter__():
            CountingList.looks += 1
            yield item


def test_the_barrier_and_the_delivery_check_cost_o1_per_member_not_on():
    size = 5000
    s = CoordinatorState(gang(size), GangPolicy(), now=1000.0)
    s.records = CountingList(s.records)
    CountingList.looks = 0
    for rank in range(size):  # in rank order: a scan from rank 0 passes every member that joined before
        s.joined(rank, rank + 1, Report())
    assert s.attempt == 1 and s.phase == coordinator_rules.RUNNING_PHASE
    # A scan of all records per join would be 12.5 million looks; the cursor makes it a few per join.
    assert CountingList.looks < 10 * size, CountingList.looks
    outcome_bodies = set()
    s.outbox.clear()
    s._finish(coordinator_rules.Outcome("Failed", 3, "worker-1 exited with 3", 1, "2026-01-01T00:00:00Z", 1, 0))
    outcome_bodies.update(id(body) for _, body in s.outbox)
    assert len(outcome_bodies) == 1  # one `done` object for every member: its JSON is made once
    CountingList.looks = 0
    for rank in range(size):
        s.reported(rank, rank + 1, Report(status="done", outcome=s.outcome.to_dict()))
        s.delivered()
    assert s.delivered()
    assert CountingList.looks < 10 * size, CountingList.looks
