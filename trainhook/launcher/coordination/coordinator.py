"""The gang's coordinator on the network: rank 0's launcher serves its gang's members over TCP.

Why a module of its own: the decisions are coordinator_rules.CoordinatorState's, pure; this is their transport, a TCP
server on the coordinator port (29497) speaking the gang's wire (wire.py: greeting, nonces, signed messages). Only
rank 0 imports it (member_run), so a member's start never loads it. The rules it carries out are
coordinator_rules.py's docstring (contract section 7).

Why one thread (issue 32): a gang of 10,000 members is 10,000 connections. Each had a thread of its own, and every
decision was written to every member's socket with the gang's lock held, so one member that did not read held up
the whole gang. Now one `selectors` loop holds every socket, non-blocking: it decides under the lock (bookkeeping, no
I/O), then signs the messages and queues them per connection outside it, written as each socket can take them. A
member that stops reading is dropped once OUT_LIMIT bytes wait for it (it reconnects and is told the state again).
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import selectors
import socket
import threading
import time
from collections import deque

from trainhook.launcher import wire
from trainhook.launcher.pod_view import GangView
from trainhook.launcher.coordination.report import Report
from trainhook.launcher.coordination.coordinator_rules import CoordinatorState
from trainhook.launcher.outcome import Outcome
from trainhook.launcher.coordination.pending import MAX_PENDING, WATCH_INTERVAL, PendingConnections
from trainhook.launcher.policy import GangPolicy
from trainhook.launcher.reach import listen
from trainhook.launcher.speak import speaker

TYPE_CHECKING = False  # typing's own, without importing typing (trainhook/launcher/__init__.py says why)
if TYPE_CHECKING:
    from typing import Callable

TICK = 0.5
ACCEPT_BURST = 256  # connections accepted per wake-up before the loop serves what is already connected
OUT_LIMIT = 4 << 20  # bytes queued for one member before its connection is dropped (it does not read)
say = speaker("coordinator")


class MemberConnection:
    """One socket and where its conversation is: the greeting (no rank yet), the signed join (a nonce sent), or a
    member's (`id` > 0)."""

    __slots__ = ("sock", "peer", "inbuf", "out", "rank", "member_nonce", "nonce", "sent", "received", "id",
                 "writing", "closed")

    def __init__(self, sock: socket.socket, peer: str):
        self.sock, self.peer = sock, peer
        self.inbuf, self.out = bytearray(), bytearray()
        self.rank = -1
        self.member_nonce = self.nonce = ""
        self.sent = self.received = self.id = 0
        self.writing = self.closed = False


class Coordinator:
    """CoordinatorState behind a TCP server run by one selectors loop. State changes happen under one lock; the
    messages they produce leave the lock in the order they were decided, and each member's are written in that
    order, so every member sees the decisions in the order they were made."""

    def __init__(self, gang: GangView, policy: GangPolicy, key: bytes, port: int,
                 log: Callable[[str], None] = say, clock: Callable[[], float] = time.time,
                 notify: Callable[[str, str, str], None] | None = None):
        """`key`: the gang's signing key (from the notary); `notify(type, reason, message)`: hands an Event to
        the notary without blocking (called with the lock held)."""
        self.gang, self.key, self.port, self.say, self.clock, self.notify = gang, key, port, log, clock, notify
        self.state = CoordinatorState(gang, policy, clock())
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.members: dict[int, MemberConnection] = {}  # connection id -> an authenticated member's connection
        self.sendq: deque = deque()  # (connection id, body) decided, not yet signed and queued (lock held)
        self.next_id = 1
        self.stopping = threading.Event()
        self.server: socket.socket | None = None
        self.selector = selectors.DefaultSelector()
        self.wake_r, self.wake_w = socket.socketpair()
        # a whole gang connecting at once is unauthenticated for a moment: strangers get MAX_PENDING beyond it
        self.pending = PendingConnections(self.say, limit=MAX_PENDING + gang.size)
        self.thread: threading.Thread | None = None
        self.accept_paused_until = 0.0

    # --- lifecycle --------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Listen (raises OSError when the port is taken) and serve on one daemon thread."""
        self.server = listen(self.port)
        for sock in (self.server, self.wake_r, self.wake_w):
            sock.setblocking(False)
        self.selector.register(self.server, selectors.EVENT_READ, None)
        self.selector.register(self.wake_r, selectors.EVENT_READ, None)
        members = (f"{self.gang.elastic[0]} to {self.gang.elastic[1]} members (elastic)" if self.gang.elastic
                   else f"the {self.gang.size} members")
        self.say(f"listening on port {self.port} for {members} of {self.gang.namespace}/{self.gang.job_name}")
        self.thread = threading.Thread(target=self._loop, daemon=True, name="coordinator")
        self.thread.start()

    def close(self) -> None:
        """Stop serving: every connection and the port are closed when this returns (from another thread)."""
        self.stopping.set()
        self._wake()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(5.0)
        elif self.thread is None:  # never started: nothing else holds these
            for sock in (self.server, self.wake_r, self.wake_w):
                if sock is not None:
                    sock.close()

    def adopt(self, outcome: Outcome, source: str) -> None:
        with self.lock:
            self.state.adopt(outcome, source)
            self._flush()
        self._wake()

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

    def threads(self) -> int:
        """The threads this coordinator runs: one, whatever the gang's size."""
        return 1 if self.thread is not None and self.thread.is_alive() else 0

    # --- decisions out ----------------------------------------------------------------------------------------
    def _flush(self) -> None:
        """Log what the state produced and take its messages out for the loop to send (lock held: no I/O here
        beyond the log lines; the signing and writing happen after the lock is released, in _send)."""
        for line in self.state.log:
            self.say(line)
        self.state.log.clear()
        events, self.state.events = self.state.events, []
        notify = self.notify
        if notify is not None:
            for event in events:
                notify(*event)
        outbox, self.state.outbox = self.state.outbox, []
        records = self.state.records
        self.sendq.extend((records[rank].connection, body) for rank, body in outbox)
        self.changed.notify_all()

    def _send(self) -> None:
        """Sign and queue what was decided, outside the lock (loop thread). A broadcast's body is one object, so
        its canonical JSON is made once, not once per member."""
        with self.lock:
            if not self.sendq:
                return
            batch, self.sendq = self.sendq, deque()
        texts: dict[int, str] = {}  # id(body) -> its canonical JSON (every body stays alive in `batch`)
        touched: dict[int, MemberConnection] = {}
        for connection, body in batch:
            conn = self.members.get(connection)
            if conn is None or conn.closed:
                continue
            text = texts.get(id(body))
            if text is None:
                text = texts[id(body)] = wire.canonical(body)
            self._queue(conn, self._signed(conn, text))
            touched[connection] = conn
        for conn in touched.values():
            self._write(conn)

    def _signed(self, conn: MemberConnection, canonical_body: str) -> bytes:
        """The signed line of wire.Channel.send, from the body's canonical JSON: {"body","mac","seq"} sorted."""
        text = "|".join((wire.PROTOCOL, wire.TO_MEMBER, conn.nonce, conn.member_nonce, str(conn.sent),
                         canonical_body))
        mac = hmac.new(self.key, text.encode(), hashlib.sha256).hexdigest()
        line = f'{{"body":{canonical_body},"mac":"{mac}","seq":{conn.sent}}}\n'.encode()
        conn.sent += 1
        return line

    def _queue(self, conn: MemberConnection, data: bytes) -> None:
        conn.out += data
        if len(conn.out) > OUT_LIMIT:
            self.say(f"dropped the connection of {self.gang.peers[conn.rank]} from {conn.peer}: it read none of "
                     f"the last {len(conn.out)} bytes sent to it")
            self._drop(conn)

    def _write(self, conn: MemberConnection) -> None:
        if conn.closed or not conn.out:
            return
        try:
            sent = conn.sock.send(conn.out)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._drop(conn)
            return
        del conn.out[:sent]
        want = bool(conn.out)
        if want != conn.writing:
            conn.writing = want
            self.selector.modify(conn.sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if want else 0), conn)

    # --- the loop ---------------------------------------------------------------------------------------------
    def _wake(self) -> None:
        try:
            self.wake_w.send(b"\0")
        except OSError:
            pass  # its buffer is full: the loop will wake anyway

    def _loop(self) -> None:
        next_tick = next_watch = time.monotonic()
        try:
            while not self.stopping.is_set():
                now = time.monotonic()
                timeout = max(0.0, min(next_tick, next_watch) - now)
                for key, mask in self.selector.select(timeout):
                    if key.fileobj is self.server:
                        self._accept()
                    elif key.fileobj is self.wake_r:
                        try:
                            self.wake_r.recv(4096)
                        except OSError:
                            pass
                    else:
                        self._serve(key.data, mask)
                    self._send()
                self._send()
                now = time.monotonic()
                if now >= next_tick:
                    next_tick = now + TICK
                    with self.lock:
                        self.state.tick(self.clock())
                        self._flush()
                    self._send()
                if now >= next_watch:
                    next_watch = now + WATCH_INTERVAL
                    self.pending.expire()  # shuts the late ones down: their EOF closes them here
                    if self.accept_paused_until and now >= self.accept_paused_until and self.server is not None:
                        self.accept_paused_until = 0.0
                        self.selector.register(self.server, selectors.EVENT_READ, None)
        finally:
            self._shutdown()

    def _serve(self, conn: MemberConnection, mask: int) -> None:
        """One connection's readiness. What fails unexpectedly costs that connection, never the loop: with one
        thread for the whole gang, an exception escaping here would silence the coordinator for every member."""
        try:
            if mask & selectors.EVENT_WRITE:
                self._write(conn)
            if mask & selectors.EVENT_READ and not conn.closed:
                self._read(conn)
        except Exception as e:  # noqa: BLE001 - said, and the connection closed; the member reconnects
            self.say(f"closed the connection from {conn.peer} after an internal error: {e!r}")
            self._drop(conn)

    def _shutdown(self) -> None:
        for key in list(self.selector.get_map().values()):
            if isinstance(key.data, MemberConnection):
                key.data.closed = True
            try:
                key.fileobj.close()  # type: ignore[union-attr]
            except OSError:
                pass
        self.selector.close()
        self.wake_w.close()
        with self.lock:
            self.members.clear()

    def _accept(self) -> None:
        """Accept what is waiting, whatever fails (a member restarted later must still find the coordinator);
        unauthenticated connections are bounded in number and time (launcher/coordination/pending.py)."""
        assert self.server is not None
        for _ in range(ACCEPT_BURST):
            try:
                sock, address = self.server.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # EMFILE and the like: stop accepting for a moment, then try again
                self.pending.refused("(accept)", f"accept failed: {e}")
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self.selector.unregister(self.server)
                    self.accept_paused_until = time.monotonic() + 0.1
                return
            peer = address[0]
            if peer.startswith("::ffff:"):  # an IPv4 peer of the dual-stack socket, as people write it
                peer = peer[len("::ffff:"):]
            sock.setblocking(False)
            conn = MemberConnection(sock, peer)
            self.selector.register(sock, selectors.EVENT_READ, conn)
            self.pending.add(sock)

    def _read(self, conn: MemberConnection) -> None:
        try:
            chunk = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._drop(conn)
            return
        conn.inbuf += chunk
        try:
            while not conn.closed:
                end = conn.inbuf.find(b"\n")
                if end < 0:
                    if len(conn.inbuf) > wire.LINE_LIMIT:
                        raise wire.RejectedMessage("a line longer than 64 KiB")
                    return
                line = bytes(conn.inbuf[:end])
                del conn.inbuf[:end + 1]
                self._line(conn, line)
        except wire.RejectedMessage as e:
            self._reject(conn, str(e))
        except ValueError as e:
            self._reject(conn, f"bad report: {e}")

    def _reject(self, conn: MemberConnection, why: str) -> None:
        if conn.id:
            self.say(f"refused a message on the connection of {self.gang.peers[conn.rank]} from {conn.peer}: {why}")
        else:
            self.pending.refused(conn.peer, why)  # at a bounded rate
            try:
                conn.sock.send(wire.canonical({"error": f"refused: {why}"}).encode() + b"\n")
            except OSError:
                pass
        self._drop(conn)

    def _line(self, conn: MemberConnection, line: bytes) -> None:
        """One line of a connection: its greeting, its signed join, or a member's signed message."""
        if conn.rank < 0:
            rank, conn.member_nonce = wire.check_member_greeting(wire.json_object(line), self.gang.namespace,
                                                                 self.gang.job_name, self.gang.size)
            conn.rank, conn.nonce = rank, wire.new_nonce()
            conn.out += wire.canonical({"protocol": wire.PROTOCOL, "nonce": conn.nonce}).encode() + b"\n"
            self._write(conn)
            return
        body = self._verified(conn, line)
        kind = body.get("type")
        if not conn.id:
            if kind != "join" or body.get("rank") != conn.rank:
                raise wire.RejectedMessage(f"expected the join of rank {conn.rank}, got {str(body)[:120]}")
            report = Report.from_dict(body.get("report"))
            self.pending.done(conn.sock)  # authenticated: no handshake deadline any more
            try:
                wire.set_keepalive(conn.sock)
            except OSError:
                pass
            with self.lock:
                conn.id, self.next_id = self.next_id, self.next_id + 1
                self.members[conn.id] = conn
                self.state.joined(conn.rank, conn.id, report)
                self._flush()
            return
        if kind == "leave":
            with self.lock:
                self.state.left(conn.rank, conn.id, str(body.get("why", ""))[:200])
                self._flush()
            return
        if kind != "state":
            raise wire.RejectedMessage(f"unexpected message {str(body)[:120]}")
        report = Report.from_dict(body.get("report"))
        with self.lock:
            self.state.reported(conn.rank, conn.id, report)
            self._flush()

    def _verified(self, conn: MemberConnection, line: bytes) -> dict:
        """The body of a member's signed line, checked as wire.Channel.receive checks it."""
        message = wire.json_object(line)
        if message is None:
            raise wire.RejectedMessage(f"not a JSON object: {line[:80]!r}")
        body, seq, mac = message.get("body"), message.get("seq"), message.get("mac")
        if not isinstance(body, dict) or not isinstance(seq, int) or not isinstance(mac, str):
            raise wire.RejectedMessage("not a signed message")
        if seq != conn.received:
            raise wire.RejectedMessage(f"message {seq} out of order (expected {conn.received}): a replay")
        expected = wire.sign(self.key, wire.TO_COORDINATOR, conn.nonce, conn.member_nonce, seq, body)
        if not wire.same_mac(mac, expected):
            raise wire.RejectedMessage("bad signature: not signed with this gang's key (another gang, or a forgery)")
        conn.received += 1
        return body

    def _drop(self, conn: MemberConnection) -> None:
        """Close a connection; a member's is lost to the gang (coordinator_rules decides what that means)."""
        if conn.closed:
            return
        conn.closed = True
        self.pending.done(conn.sock)
        try:
            self.selector.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        try:
            conn.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        conn.sock.close()
        if conn.id:
            with self.lock:
                self.members.pop(conn.id, None)
                self.state.lost(conn.rank, conn.id)
                self._flush()
