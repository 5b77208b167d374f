"""The gang's coordinator on the network: rank 0's launcher serves its gang's members over TCP.

Why a module of its own: the decisions are coordinator_rules.CoordinatorState's, pure; this is their transport, a TCP
server on the coordinator port (29497) speaking gang_protocol (greeting, nonces, signed messages), one thread per member
connection and one for time, everything under one lock. Only rank 0 imports it (gang_run), so a member's start
never loads it. The rules it carries out are coordinator_rules.py's docstring (contract section 7).
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Callable

from trainhook.launcher import wire
from trainhook.launcher.pod_view import GangView
from trainhook.launcher.wire import set_keepalive
from trainhook.launcher.coordination.report import Report
from trainhook.launcher.coordination.coordinator_rules import CoordinatorState
from trainhook.launcher.outcome import Outcome
from trainhook.launcher.coordination.pending import PendingConnections
from trainhook.launcher.policy import GangPolicy
from trainhook.launcher.reach import listen
from trainhook.launcher.speak import speaker

TICK = 0.5
say = speaker("coordinator")


class Coordinator:
    """CoordinatorState behind a TCP server. All state changes happen under one lock, and the messages they produce
    are sent before it is released, so every member sees them in the order they were decided."""

    def __init__(self, gang: GangView, policy: GangPolicy, key: bytes, port: int,
                 log: Callable[[str], None] = say, clock: Callable[[], float] = time.time,
                 notify: Callable[[str, str, str], None] | None = None):
        """`key`: the gang's signing key (from the notary); `notify(type, reason, message)`: hands an Event to
        the notary without blocking (called with the lock held)."""
        self.gang, self.key, self.port, self.say, self.clock = gang, key, port, log, clock
        self.notify = notify
        self.state = CoordinatorState(gang, policy, clock())
        self.lock = threading.Lock()
        self.channels: dict[int, wire.Channel] = {}
        self.next_id = 1
        self.stopping = threading.Event()
        self.server: socket.socket | None = None
        self.changed = threading.Condition(self.lock)

    # --- lifecycle --------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Listen (raises OSError when the port is taken) and serve on daemon threads."""
        self.server = listen(self.port)
        members = (f"{self.gang.elastic[0]} to {self.gang.elastic[1]} members (elastic)" if self.gang.elastic
                   else f"the {self.gang.size} members")
        self.say(f"listening on port {self.port} for {members} of {self.gang.namespace}/{self.gang.job_name}")
        threading.Thread(target=self._accept, daemon=True, name="coordinator-accept").start()
        threading.Thread(target=self._ticker, daemon=True, name="coordinator-tick").start()

    def close(self) -> None:
        self.stopping.set()
        if self.server is not None:
            self.server.close()
        with self.lock:
            for channel in list(self.channels.values()):
                channel.close()

    def adopt(self, outcome: Outcome, source: str) -> None:
        with self.lock:
            self.state.adopt(outcome, source)
            self._flush()

    def wait_delivered(self, timeout: float) -> bool:
        """Block until every member acknowledged the outcome (or `timeout`)."""
        end = time.monotonic() + timeout
        with self.changed:
            while not self.state.delivered():
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self.changed.wait(min(left, 0.5))
        return True

    # --- plumbing ---------------------------------------------------------------------------------------------
    def _flush(self) -> None:
        """Log and send what the state produced (lock held)."""
        for line in self.state.log:
            self.say(line)
        self.state.log.clear()
        events, self.state.events = self.state.events, []
        notify = self.notify
        if notify is not None:
            for event in events:
                notify(*event)
        outbox, self.state.outbox = self.state.outbox, []
        for rank, body in outbox:
            channel = self.channels.get(self.state.records[rank].connection)
            if channel is None:
                continue
            try:
                channel.send(body)
            except OSError:
                channel.close()  # its reader thread reports the loss
        self.changed.notify_all()

    def _ticker(self) -> None:
        while not self.stopping.wait(TICK):
            with self.lock:
                self.state.tick(self.clock())
                self._flush()

    def _accept(self) -> None:
        """Accept until closed, whatever fails (a member restarted later must still find the coordinator);
        unauthenticated connections are bounded in number and time (launcher/coordination/pending.py)."""
        assert self.server is not None
        self.pending = PendingConnections(self.say)
        self.pending.watch(self.stopping)
        while not self.stopping.is_set():
            try:
                sock, address = self.server.accept()
            except OSError as e:
                if self.stopping.is_set():
                    return
                self.pending.refused("(accept)", f"accept failed: {e}")  # EMFILE and the like: try again
                time.sleep(0.1)
                continue
            peer = address[0]
            if peer.startswith("::ffff:"):  # an IPv4 peer of the dual-stack socket, as people write it
                peer = peer[len("::ffff:"):]
            self.pending.add(sock)
            try:
                threading.Thread(target=self._serve_pending, args=(sock, peer), daemon=True).start()
            except RuntimeError as e:  # no thread to be had: this connection only is lost
                self.pending.done(sock)
                sock.close()
                self.pending.refused(peer, f"cannot start a thread for it: {e}")

    def _serve_pending(self, sock: socket.socket, peer: str) -> None:
        try:
            self._serve(sock, peer)
        finally:
            self.pending.done(sock)

    def _refuse(self, sock: socket.socket, peer: str, why: str) -> None:
        self.pending.refused(peer, why)  # at a bounded rate
        try:
            wire.send_plain(sock, {"error": f"refused: {why}"})
        except OSError:
            pass
        sock.close()

    def _serve(self, sock: socket.socket, peer: str) -> None:
        """One member's connection: greetings, its signed join, then its reports until it goes away."""
        wire_sock = sock
        try:
            wire_sock.settimeout(wire.GREETING_TIMEOUT)
            reader = wire.LineReader(wire_sock)
            rank, member_nonce = wire.check_member_greeting(reader.read(), self.gang.namespace,
                                                            self.gang.job_name, self.gang.size)
            nonce = wire.new_nonce()
            wire.send_plain(wire_sock, {"protocol": wire.PROTOCOL, "nonce": nonce})
            channel = wire.Channel(wire_sock, reader, self.key, "coordinator", nonce, member_nonce)
            body = channel.receive()
            if body is None:
                wire_sock.close()
                return
            if body.get("type") != "join" or body.get("rank") != rank:
                raise wire.RejectedMessage(f"expected the join of rank {rank}, got {str(body)[:120]}")
            report = Report.from_dict(body.get("report"))
            wire_sock.settimeout(None)
            set_keepalive(wire_sock)
            self.pending.done(wire_sock)  # authenticated: no handshake deadline any more
        except wire.RejectedMessage as e:
            self._refuse(wire_sock, peer, str(e))
            return
        except ValueError as e:
            self._refuse(wire_sock, peer, f"bad report: {e}")
            return
        except OSError:
            wire_sock.close()
            return
        with self.lock:
            connection, self.next_id = self.next_id, self.next_id + 1
            self.channels[connection] = channel
            self.state.joined(rank, connection, report)
            self._flush()
        try:
            while True:
                body = channel.receive()
                if body is None:
                    break
                if body.get("type") == "leave":
                    with self.lock:
                        self.state.left(rank, connection, str(body.get("why", ""))[:200])
                        self._flush()
                    continue
                if body.get("type") != "state":
                    raise wire.RejectedMessage(f"unexpected message {str(body)[:120]}")
                report = Report.from_dict(body.get("report"))
                with self.lock:
                    self.state.reported(rank, connection, report)
                    self._flush()
        except wire.RejectedMessage as e:
            self.say(f"refused a message on the connection of {self.gang.peers[rank]} from {peer}: {e}")
        except ValueError as e:
            self.say(f"refused a message from {peer}: bad report: {e}")
        except OSError:
            pass
        channel.close()
        with self.lock:
            self.channels.pop(connection, None)
            self.state.lost(rank, connection)
            self._flush()

