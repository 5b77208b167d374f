"""The listening socket and every connection on it, bounded: what stands between aiohttp and hostile clients.

Why not aiohttp's TCPSite: `loop.create_server` accepts every connection at once and gives each TLS connection
asyncio's 256 KiB read buffer before its handshake even starts, with no deadline on the handshake's first bytes
or on a request head (aiohttp's only timer is the keep-alive one), so 1,000 clients that open a connection and
then say nothing took the server past its memory limit (issue 23). Here the accept loop is ours:

- at most `Limits.max_connections` open (handshaking included), `per_source` of them from one source address
  (admission port: MAX_CONNECTIONS both; notary port: NOTARY_MAX_CONNECTIONS, MAX_CONNECTIONS a source). One more
  from a source at its share evicts one of its own; one more past the total, one of the source holding the most
  (one pod's flood evicts its own connections, never the API server's or a member's): its oldest connection
  without a complete request head yet, else the one whose handler has waited longest (over BODY_STALL) for a body
  that does not come (a real client's follows its head within milliseconds; such heads once held the notary,
  issue 31 item 3), else the one idle longest, else any one waiting for its body; a source with none of these is
  passed over, and with no source left the new connection is closed at once;
- a gang's burst (issue 32): its members connect to the notary at once, and evicting the oldest handshake for
  each new one evicted the one served next, again and again (1,280 members: 95,418 evictions in 3 minutes). So
  past the notary's total a pending connection younger than `pending_grace`, of a source holding fewer than
  `crowded` (a pod's launcher, not a flood), is not evicted: the new one is closed at once, before any TLS work,
  and its launcher retries after a jittered back-off (the admission port has no grace);
- a TLS connection reads into READ_BUFFER (asyncio's 256 KiB would put 1,024 connections past the chart's memory
  limit); no TLS session ticket is issued (no client here resumes one);
- HEAD_DEADLINE from accept for the TLS handshake, and from the first byte of a request head, arriving on an
  idle connection, to the complete head;
- IDLE_TIMEOUT for an idle connection (after the handshake, or between two requests: aiohttp's keepalive_timeout).
  It is longer than the API server's own idle timeout (90 s, Go's http.DefaultTransport, which client-go's webhook
  transport keeps), so the API server closes an idle connection first. A server that closes it first races the API
  server's next review onto the closing connection: the API server does not retry a POST, and the review fails
  with "failed calling webhook ...: EOF" (seen in CI when this was HEAD_DEADLINE, 5 s);
- request heads bounded by aiohttp's limits (MAX_HEADERS fields of at most MAX_FIELD_SIZE bytes each);
- bodies that did not come with their head are read within a byte budget shared by all connections
  (`BodyBudget`, webhook/serving.py with the rest of the aiohttp glue), so trickled 4 MiB bodies cannot multiply.

So memory is bounded by the connections x (the TLS buffer + a bounded head) + BODY_BUDGET, and a real client
(whose handshake and head take milliseconds) is never kept out by idle ones. The accept loop never ends on an
error (out of file descriptors, a failed handshake): it logs at a bounded rate and goes on.
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import contextlib
import logging
import os
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web

log = logging.getLogger("trainhook.webhook.connections")


def _env_number(name: str, default: float) -> float:
    """A limit from the environment (`TRAINHOOK_WEBHOOK_<NAME>`), for operators and tests; bad values fail loudly."""
    text = os.environ.get(f"TRAINHOOK_WEBHOOK_{name}", "")
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"TRAINHOOK_WEBHOOK_{name}={text!r} is not a number; unset it for {default:g}") from None
    if value <= 0:
        raise ValueError(f"TRAINHOOK_WEBHOOK_{name}={text!r} must be positive; unset it for {default:g}")
    return value


# Seconds from accept to the end of the TLS handshake, and from a request head's first byte to its end.
HEAD_DEADLINE = _env_number("HEAD_DEADLINE", 5.0)
# Seconds an idle connection is kept: above the API server's 90 s, so the API server always closes it first.
IDLE_TIMEOUT = _env_number("IDLE_TIMEOUT", 120.0)
# Open connections at most (the API server keeps a few per replica); on the notary port, from one source address.
MAX_CONNECTIONS = int(_env_number("MAX_CONNECTIONS", 128))
# The notary port's: open connections in all (a gang's members connect at once), and the seconds a pending one
# is safe from eviction by the total's (its handshake queued behind a burst's).
NOTARY_MAX_CONNECTIONS = int(_env_number("NOTARY_MAX_CONNECTIONS", 1024))
PENDING_GRACE = _env_number("PENDING_GRACE", 3.0)
CROWDED = 4  # a source holding this many connections or more (a flood, not a pod's launcher) has no grace
# Bytes asyncio reads from a TLS socket at once and allocates per connection (a larger body takes more reads).
READ_BUFFER = 32 * 1024
# Seconds a handler may wait for a body before its connection is evicted ahead of idle ones when room is needed.
BODY_STALL = _env_number("BODY_STALL", 1.0)
# Bytes of request bodies being read at one time, over all connections (a review's body is usually in its
# first read, with the head, and needs none of it).
BODY_BUDGET = int(_env_number("BODY_BUDGET", 32 * 1024 * 1024))
# Bounds on a request head (aiohttp's defaults are 128 fields of 8 KiB): an AdmissionReview POST has a handful.
MAX_HEADERS = 32
MAX_FIELD_SIZE = 8190
# Refusals and evictions are logged at most once per this many seconds, with their counts since.
LOG_INTERVAL = 10.0

if getattr(asyncio.sslproto.SSLProtocol, "max_size", 0) > READ_BUFFER:  # a class attribute read at each connection
    asyncio.sslproto.SSLProtocol.max_size = READ_BUFFER


@dataclass(frozen=True)
class Limits:
    """A listener's bounds: connections in all, from one source address, a pending one's grace, the backlog."""

    max_connections: int = MAX_CONNECTIONS
    per_source: int = MAX_CONNECTIONS
    pending_grace: float = 0.0  # for the connections of a source holding fewer than `crowded`
    backlog: int = 128
    crowded: int = 1  # the admission port's: every source in the one order, largest first


NOTARY = Limits(max(NOTARY_MAX_CONNECTIONS, MAX_CONNECTIONS), MAX_CONNECTIONS, PENDING_GRACE,
                min(4096, max(128, NOTARY_MAX_CONNECTIONS)), CROWDED)


@dataclass(eq=False)
class Connection:
    """One accepted connection: from accept (handshaking, no transport yet) to its close."""

    accepted: float
    sock: socket.socket | None  # until the handshake ends; then the transport owns it
    peer: str = ""  # the client's address (its source: what eviction shares room by)
    handshake: asyncio.Task | None = None
    timer: asyncio.TimerHandle | None = None  # the handshake's deadline, then a head's
    head_since: float | None = None  # when a request head began to arrive on the idle connection (loop time)
    transport: asyncio.Transport | None = None
    heads: int = 0  # requests whose complete head arrived
    active: int = 0  # requests being answered now
    idle_since: float = field(default=0.0)
    body_since: float | None = None  # when its handler began to wait for a body not yet arrived (loop time)


class RateLimitedLog:
    """Counts events and logs them at most once per LOG_INTERVAL, so a flood of clients cannot flood the log."""

    def __init__(self, message: str) -> None:
        self.message, self.last = message, float("-inf")
        self.counts: dict[str, int] = {}

    def count(self, reason: str) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1
        now = time.monotonic()
        if now - self.last >= LOG_INTERVAL:
            self._write(LOG_INTERVAL, now)

    def flush(self) -> None:
        """Log what was counted since the last line (at a stop: a flood's last seconds are not lost with it)."""
        if self.counts:
            now = time.monotonic()
            self._write(now - self.last, now)

    def _write(self, seconds: float, now: float) -> None:
        log.warning(self.message, extra={"counts": self.counts, "seconds": seconds})
        self.counts, self.last = {}, now


class Tracked(asyncio.Protocol):
    """aiohttp's protocol for one connection, with the guard told when it starts and ends."""

    def __init__(self, guard: ConnectionGuard, conn: Connection, inner: asyncio.Protocol) -> None:
        self.guard, self.conn, self.inner = guard, conn, inner

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Registered before aiohttp sees the transport: its first request may be answered before the
        # handshake's awaiter resumes.
        self.conn.transport = transport  # type: ignore[assignment]
        self.guard.by_transport[transport] = self.conn
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.guard.bytes_arrived(self.conn)
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        try:
            self.inner.connection_lost(exc)
        finally:
            self.guard.forget(self.conn)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


class ConnectionGuard:
    """Accepts on a socket and hands each connection, TLS done, to `protocol_factory` (aiohttp's web.Server,
    set with the TLS context by serving.py's `serve_app` once the runner is set up)."""

    def __init__(self, max_connections: int = MAX_CONNECTIONS, head_deadline: float = HEAD_DEADLINE,
                 limits: Limits | None = None) -> None:
        """`limits` (the notary's, NOTARY) bound the connections in all, a source's and a pending one's grace;
        without them, `max_connections` in all and from one source, no grace (the admission port's)."""
        self.protocol_factory: Callable[[], asyncio.Protocol] | None = None
        self.context: ssl.SSLContext | None = None
        limits = limits or Limits(max_connections=max_connections, per_source=max_connections)
        self.limits, self.head_deadline = limits, head_deadline
        self.max_connections, self.per_source = limits.max_connections, min(limits.per_source, limits.max_connections)
        self.open: dict[Connection, None] = {}  # insertion-ordered: the oldest accepted first
        self.sources: dict[str, dict[Connection, None]] = {}  # the same, by source address
        self.waiting: dict[Connection, None] = {}  # waiting for a body
        self.idle: dict[Connection, None] = {}  # answered, between requests: the longest idle first
        self.by_transport: dict[asyncio.BaseTransport, Connection] = {}
        self.refusals = RateLimitedLog("connections refused or closed early")

    def forget(self, conn: Connection) -> None:
        """Stop counting `conn`, and drop every reference to it (a closed connection's buffers are freed now,
        not when its deadline would have passed)."""
        if conn in self.open:
            del self.open[conn]
            own = self.sources[conn.peer]
            del own[conn]
            if not own:
                del self.sources[conn.peer]
        self.waiting.pop(conn, None)
        self.idle.pop(conn, None)
        if conn.timer is not None:
            conn.timer.cancel()
            conn.timer = None
        if conn.transport is not None:
            self.by_transport.pop(conn.transport, None)

    def close(self, conn: Connection, reason: str) -> None:
        """Close `conn` now: pending ones are aborted (nothing to flush), idle ones closed (a reply may be
        buffered); either way it stops counting at once."""
        self.refusals.count(reason)
        self.forget(conn)
        if conn.transport is None:
            if conn.handshake is not None:
                conn.handshake.cancel()  # asyncio closes the socket when the handshake is cancelled
            elif conn.sock is not None:
                conn.sock.close()
        elif conn.heads == 0 or conn.body_since is not None:  # nothing to flush: a body never came
            conn.transport.abort()
        else:
            conn.transport.close()

    def _make_room(self) -> bool:
        """Close one connection to make room for a new one (see the module docstring for the order), from the
        source holding the most; False when every connection is answering a request whose body has arrived, or
        is pending for less than the grace."""
        crowded = self.limits.crowded
        for conns in sorted((c for c in self.sources.values() if len(c) >= crowded), key=len, reverse=True):
            victim = self._victim(conns)
            if victim is not None:
                self.close(*victim)
                return True
        victim = self._sparse_victim() if crowded > 1 else None
        if victim is not None:
            self.close(*victim)
        return victim is not None

    def _sparse_victim(self) -> tuple[Connection, str] | None:
        """`_victim`'s order over the sources holding fewer than `crowded` (pods' launchers) at once, without a
        look at each of a burst's 1,024 connections for every new one (0.9 ms a connection refused): the oldest
        pending one past the grace (the open ones are in accept order: the first one within it ends the search),
        else the longest-stalled body, else the longest idle, else any one waiting for its body."""
        loop, grace, crowded = asyncio.get_running_loop(), self.limits.pending_grace, self.limits.crowded
        now = loop.time()
        for conn in self.open:
            if now - conn.accepted < grace:
                break
            if conn.heads == 0 and len(self.sources[conn.peer]) < crowded:
                return conn, "evicted: no request head yet"
        waiting = [c for c in self.waiting if len(self.sources[c.peer]) < crowded]
        stalled = min(waiting, key=lambda c: c.body_since or 0.0) if waiting else None
        if stalled is not None and now - (stalled.body_since or now) >= BODY_STALL:
            return stalled, "evicted: body not sent"
        idle = next((c for c in self.idle if len(self.sources[c.peer]) < crowded), None)
        if idle is not None:
            return idle, "evicted: idle"
        return (stalled, "evicted: body not sent") if stalled is not None else None

    @staticmethod
    def _victim(conns: dict[Connection, None]) -> tuple[Connection, str] | None:
        """Which of one source's connections (oldest first) to close (the module docstring's order)."""
        pending = next((c for c in conns if c.heads == 0), None)
        if pending is not None:
            return pending, "evicted: no request head yet"
        waiting = [c for c in conns if c.body_since is not None]
        stalled = min(waiting, key=lambda c: c.body_since or 0.0) if waiting else None
        now = asyncio.get_running_loop().time()
        if stalled is not None and now - (stalled.body_since or now) >= BODY_STALL:
            return stalled, "evicted: body not sent"
        idle = [c for c in conns if c.active == 0]
        if idle:
            return min(idle, key=lambda c: c.idle_since), "evicted: idle"
        return (stalled, "evicted: body not sent") if stalled is not None else None

    async def serve(self, listener: socket.socket) -> None:
        """The accept loop; runs until cancelled, whatever fails on the way."""
        loop = asyncio.get_running_loop()
        listener.setblocking(False)
        while True:
            try:
                sock, _ = await loop.sock_accept(listener)
            except asyncio.CancelledError:
                raise
            except OSError as e:  # EMFILE, ENFILE, ENOBUFS...: the next accept may work, never stop accepting
                self.refusals.count(f"accept failed: {e.strerror or e}")
                await asyncio.sleep(0.1)
                continue
            try:
                self.accept(loop, sock)
            except Exception as e:  # noqa: BLE001  one connection's failure must not end the loop
                self.refusals.count(f"cannot start a connection: {e}")
                sock.close()

    def accept(self, loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
        try:
            peer = str(sock.getpeername()[0])
        except OSError:  # already reset by the client
            peer = ""
        own = self.sources.get(peer)
        if own is not None and len(own) >= self.per_source:  # a source past its share makes room from its own
            victim = self._victim(own)
            if victim is None:
                self.refusals.count("closed at once: every connection of its source is answering a request")
                sock.close()
                return
            self.close(*victim)
        if len(self.open) >= self.max_connections and not self._make_room():  # (room made before this one counts)
            self.refusals.count("closed at once: every connection is answering a request or new")
            sock.close()
            return
        conn = Connection(accepted=loop.time(), sock=sock, peer=peer)
        self.open[conn] = None
        self.sources.setdefault(peer, {})[conn] = None
        conn.timer = loop.call_at(conn.accepted + self.head_deadline, self._check_deadline, conn)
        conn.handshake = loop.create_task(self._handshake(loop, conn, sock))

    async def _handshake(self, loop: asyncio.AbstractEventLoop, conn: Connection, sock: socket.socket) -> None:
        assert self.protocol_factory is not None
        factory = self.protocol_factory
        try:
            await loop.connect_accepted_socket(lambda: Tracked(self, conn, factory()), sock,
                                               ssl=self.context, ssl_handshake_timeout=self.head_deadline,
                                               ssl_shutdown_timeout=2.0)
        except asyncio.CancelledError:
            pass  # closed by the guard (evicted, or past its deadline)
        except Exception as e:  # noqa: BLE001  a failed handshake ends that connection only
            log.debug("TLS handshake failed", extra={"error": str(e)})
        finally:
            conn.handshake, conn.sock = None, None
            if conn.transport is None:  # never reached aiohttp: nothing else will forget it
                self.forget(conn)

    def _check_deadline(self, conn: Connection) -> None:
        """The handshake must be over by accept + HEAD_DEADLINE, and a head begun on an idle connection complete
        by its first byte + HEAD_DEADLINE. A connection merely idle is left to IDLE_TIMEOUT (aiohttp's)."""
        conn.timer = None
        if conn not in self.open:
            return
        if conn.transport is None:
            self.close(conn, f"closed: no TLS handshake within {self.head_deadline:g} s")
        elif conn.head_since is not None:
            loop = asyncio.get_running_loop()
            due = conn.head_since + self.head_deadline
            if loop.time() >= due:
                self.close(conn, f"closed: request head not complete within {self.head_deadline:g} s")
            else:
                conn.timer = loop.call_at(due, self._check_deadline, conn)

    def bytes_arrived(self, conn: Connection) -> None:
        """Bytes on a connection answering nothing are a request head beginning: its deadline starts now."""
        if conn.active == 0 and conn.head_since is None and conn in self.open:
            loop = asyncio.get_running_loop()
            conn.head_since = loop.time()
            if conn.timer is None:
                conn.timer = loop.call_at(conn.head_since + self.head_deadline, self._check_deadline, conn)

    def request_started(self, transport: asyncio.BaseTransport | None) -> Connection | None:
        conn = self.by_transport.get(transport) if transport is not None else None
        if conn is not None:
            conn.heads += 1
            conn.active += 1
            conn.head_since = None
            self.idle.pop(conn, None)
        return conn

    def request_done(self, conn: Connection | None) -> None:
        if conn is not None:
            conn.active -= 1
            conn.idle_since = time.monotonic()
            if conn.active == 0 and conn in self.open:
                self.idle[conn] = None

    @contextlib.contextmanager
    def awaiting_body(self, transport: asyncio.BaseTransport | None):
        """Marks the connection as waiting for its request's body while the block runs (a handler's read of a
        body that did not come with the head): such a connection may be evicted when room is needed."""
        conn = self.by_transport.get(transport) if transport is not None else None
        if conn is not None:
            conn.body_since = asyncio.get_running_loop().time()
            if conn in self.open:
                self.waiting[conn] = None
        try:
            yield
        finally:
            if conn is not None:
                conn.body_since = None
                self.waiting.pop(conn, None)

    def middleware(self):
        """Marks a connection's request head as complete (aiohttp calls handlers once the head is parsed)."""
        @web.middleware
        async def track(request: web.Request, handler):
            conn = self.request_started(request.transport)
            try:
                return await handler(request)
            finally:
                self.request_done(conn)
        return track
