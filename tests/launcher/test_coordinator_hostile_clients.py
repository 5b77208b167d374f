"""A real coordinator on loopback against clients that connect and never authenticate (issue 23 item 2): 400
connections that each send one byte every 8 s (under the old per-read timeout of 10 s, they held 405 threads,
225 connections after 32 s and 226 log lines). Every such connection is closed within the handshake deadline, the
log stays short, and the real members still join; the coordinator's threads stay a fixed few (issue 32: one
selectors loop, no thread per connection, so 400 strangers add none)."""

from __future__ import annotations

import queue
import socket
import threading
import time

from test_gang_protocol import TOKEN, env, free_port, gang, next_directive, started_tcp_gang
from trainhook.launcher.coordination import pending
from trainhook.launcher.coordination.coordinator import Coordinator
from trainhook.launcher.coordination.report import Report
from trainhook.launcher.pod_view import parse_gang
from trainhook.launcher.coordination.link import Link
from trainhook.launcher.policy import GangPolicy, read_settings

TRICKLERS = 400


def closed_by_peer(sock: socket.socket) -> bool:
    sock.settimeout(0.0)
    try:
        return sock.recv(4096) == b"" or closed_by_peer(sock)
    except BlockingIOError:
        return False
    except OSError:
        return True


def test_trickling_clients_are_bounded_closed_in_time_and_a_real_member_still_joins():
    port = free_port()
    lines: list[str] = []
    coordinator = Coordinator(gang(2), GangPolicy(), TOKEN, port, log=lines.append)
    threads_before = threading.active_count()
    coordinator.start()
    clients: list[socket.socket] = []
    links = []
    stop = threading.Event()
    peak = {"threads": 0}

    def sample() -> None:
        while not stop.wait(0.1):
            peak["threads"] = max(peak["threads"], threading.active_count())
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        for _ in range(TRICKLERS):
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            sock.sendall(b"{")
            clients.append(sock)
        opened = time.monotonic()

        def trickle() -> None:  # one byte every 8 s, each under the old per-read timeout
            while not stop.wait(8):
                for sock in clients:
                    try:
                        sock.sendall(b" ")
                    except OSError:
                        pass
        threading.Thread(target=trickle, daemon=True).start()
        settings = read_settings(env(TRAINHOOK_COORDINATOR_PORT=str(port)), parse_gang(env()))
        settings = settings.replace(key=TOKEN)
        for rank in (0, 1):
            events: queue.SimpleQueue = queue.SimpleQueue()
            link = Link(gang(2, rank), settings, events, Report())
            link.start()
            links.append((link, events))
        for _, events in links:
            assert next_directive(events, "start", timeout=15)["attempt"] == 1
        time.sleep(max(0.0, opened + pending.HANDSHAKE_DEADLINE + 2 * pending.WATCH_INTERVAL + 0.5
                       - time.monotonic()))
        still_open = [s for s in clients if not closed_by_peer(s)]
        assert not still_open, f"{len(still_open)} of {TRICKLERS} trickling connections still open"
        # The coordinator's one loop, two members' links, this test's sampler and trickler: no thread per connection.
        assert peak["threads"] - threads_before <= 5, peak
        assert coordinator.threads() == 1
        assert len(coordinator.pending) == 0
        refusals = [line for line in lines if "refused" in line]
        assert 1 <= len(refusals) <= pending.LOG_BURST + 2, refusals
    finally:
        stop.set()
        for link, _ in links:
            link.close()
        for sock in clients:
            sock.close()
        coordinator.close()



def test_lines_nested_past_the_json_parsers_limit_are_refused_at_a_bounded_rate_and_members_still_join():
    """A stranger's greeting of 5,000 "[" once escaped as a RecursionError: that connection was closed as an
    internal error with a log line each, at no bounded rate. Now it is a line that is not a JSON object."""
    lines: list[str] = []
    answers: list[bytes] = []

    def strangers(port: int) -> None:
        for _ in range(100):
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                sock.sendall(b"[" * 5000 + b"\n")
                sock.settimeout(5)
                answers.append(sock.recv(4096))
    coordinator, _, links = started_tcp_gang(lines.append, before=strangers)  # the members still start
    try:
        assert len(answers) == 100 and all(a.startswith(b'{"error":"refused: ') for a in answers), answers[:3]
        assert not [line for line in lines if "internal error" in line], lines[:3]
        assert 1 <= len([line for line in lines if "refused" in line]) <= pending.LOG_BURST + 2, lines
    finally:
        for link, _ in links:
            link.close()
        coordinator.close()
