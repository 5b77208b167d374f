"""A member's link to its gang's coordinator: one connection to rank 0's launcher, kept up in the background.

Why a module of its own: the link is the member's whole conversation with the coordinator (greeting, the signed
join, reconnecting with backoff, the latest report re-sent on every join), and gang_run.py's MemberLauncher only
reads the events it queues; rank 0's launcher uses the same link over loopback, so every member takes one path.
"""

from __future__ import annotations

import queue
import socket
import threading
import time

from trainhook.launcher import wire
from trainhook.launcher.pod_view import GangView
from trainhook.launcher.wire import set_keepalive
from trainhook.launcher.coordination.report import Report
from trainhook.launcher.policy import LaunchSettings
from trainhook.launcher.reach import Backoff, PeerAddress, connect_peer, retry_floor, search_domain
from trainhook.launcher.speak import speaker

# Reconnect backoff (reach.Backoff). Members usually start before rank 0's coordinator listens (or before its name
# resolves), and every second a member sleeps past that is a second of the gang's start: so the cap starts at half
# a second, jittered so a large gang's members do not knock in step, and rises with the time waited only when the
# wait is long (then a few seconds late costs little, and the cluster DNS is not asked twice a second per member).
LINK_FLOOR = 0.5
REPORT_EVERY = 30.0

say = speaker("run")


class Link(threading.Thread):
    """The member's connection to the coordinator, kept up in the background (reconnecting with backoff).

    What arrives goes to the member's event queue as ("directive", body); ("connected",) and ("lost", why)
    tell it about the connection. `update` sends the member's report (and keeps it for the next join), so the
    coordinator always ends up with the latest account, whatever was lost on the way."""

    def __init__(self, gang: GangView, settings: LaunchSettings, events: queue.SimpleQueue, report: Report):
        super().__init__(daemon=True, name="gang-link")
        self.gang, self.settings, self.events = gang, settings, events
        self.address = "127.0.0.1" if gang.rank == 0 else gang.peers[0].address
        # rank 0's name, absolute, resolved once and reused while connects are refused (issue 26: re-resolving its
        # relative name before every attempt cost a 32-pod gang thousands of DNS queries)
        self.target = PeerAddress(self.address, None if gang.rank == 0 else search_domain(gang.namespace))
        self.lock = threading.Lock()
        self.channel: wire.Channel | None = None
        self.latest = report.to_dict()
        self.closing = threading.Event()
        self.quiet = False  # once the gang is done, losing the coordinator is expected (it may be scaled away)
        self.last_error = "not tried yet"

    def update(self, report: Report) -> None:
        with self.lock:
            self.latest = report.to_dict()
            if self.channel is not None:
                try:
                    self.channel.send({"type": "state", "report": self.latest})
                except OSError:
                    pass  # the reader sees the loss; the next join carries this report

    def leave(self, why: str) -> None:
        """Tell the coordinator this member is leaving an elastic gang (see elastic.py), if connected."""
        with self.lock:
            if self.channel is not None:
                try:
                    self.channel.send({"type": "leave", "why": why})
                except OSError:
                    pass  # the coordinator sees the connection go instead

    def close(self) -> None:
        self.closing.set()
        with self.lock:
            if self.channel is not None:
                self.channel.close()

    def run(self) -> None:
        backoff, said, said_at = Backoff(LINK_FLOOR), "", 0.0
        while not self.closing.is_set():
            try:
                channel = self._connect()
            except (OSError, wire.RejectedMessage, ValueError) as e:
                self.last_error = describe_error(e)
                now = time.monotonic()
                if not self.quiet and (self.last_error != said or now - said_at > REPORT_EVERY):
                    say(f"cannot reach the gang's coordinator (rank 0 at {self.address}:{self.settings.port}) "
                        f"yet: {self.last_error}; retrying")
                    said, said_at = self.last_error, now
                self.closing.wait(backoff.next(retry_floor(e, LINK_FLOOR)))
                continue
            backoff, said = Backoff(LINK_FLOOR), ""
            why = "the connection closed"
            try:
                while True:
                    body = channel.receive()
                    if body is None:
                        break
                    self.events.put(("directive", body))
            except wire.RejectedMessage as e:
                why = f"refused a message from the coordinator: {e}"
                say(why)
            except OSError as e:
                why = describe_error(e)
            with self.lock:
                self.channel = None
            channel.close()
            self.target.lost()  # rank 0's pod may have restarted, with another address
            if not self.closing.is_set():
                self.events.put(("lost", why))

    def _connect(self) -> wire.Channel:
        sock = connect_peer(self.target, self.settings.port, wire.GREETING_TIMEOUT)
        try:
            sock.settimeout(wire.GREETING_TIMEOUT)
            nonce = wire.new_nonce()
            wire.send_plain(sock, wire.member_greeting(self.gang.namespace, self.gang.job_name, self.gang.rank,
                                                       nonce))
            reader = wire.LineReader(sock)
            answer = reader.read()
            if answer is None:
                raise ConnectionError("the coordinator closed the connection")
            if "error" in answer or not isinstance(answer.get("nonce"), str):
                raise wire.RejectedMessage(str(answer.get("error") or "no nonce in the coordinator's greeting"))
            channel = wire.Channel(sock, reader, self.settings.key, "member", answer["nonce"], nonce)
            with self.lock:
                joined = self.latest
                channel.send({"type": "join", "rank": self.gang.rank, "report": joined})
            welcome = channel.receive()  # signed: proves the coordinator holds the gang's token
            if welcome is None:
                raise ConnectionError("the coordinator closed the connection (did it refuse us? see its log)")
            # A gang already done answers a (re)joining member with its outcome instead of a welcome: that is
            # the member's directive too (it ends as the gang did), not a refusal to retry until the deadline.
            if welcome.get("type") not in ("welcome", "done"):
                raise wire.RejectedMessage(f"expected a welcome, got {str(welcome)[:120]}")
            sock.settimeout(None)
            set_keepalive(sock)
            with self.lock:
                self.channel = channel
                if self.latest != joined:
                    channel.send({"type": "state", "report": self.latest})
        except BaseException:
            sock.close()
            raise
        self.events.put(("connected",))
        self.events.put(("directive", welcome))
        return channel


def describe_error(error: BaseException) -> str:
    if isinstance(error, socket.gaierror):
        return "its address does not resolve"
    if isinstance(error, ConnectionRefusedError):
        return "connection refused (its launcher is not listening yet)"
    if isinstance(error, (socket.timeout, TimeoutError)):
        return "timed out"
    if isinstance(error, wire.RejectedMessage):
        return f"refused: {error}"
    return str(error) or type(error).__name__
