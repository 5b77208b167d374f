"""Bounds on the coordinator's connections until they authenticate (issues 23 and 32). Standard library only.

Anyone who can reach rank 0's pod can connect to the coordinator port before proving anything. Until issue 32 each
connection had its own thread, so a client that sent one byte every 8 s (under a per-read timeout of 10 s) held a
thread and a socket for as long as it liked, and 400 of them made 405 threads and 226 log lines. The coordinator's
one selectors loop (coordinator.py) holds no thread per connection; what a pending connection still holds is a socket
and its buffer, so here:

- HANDSHAKE_DEADLINE bounds the whole handshake (greeting, nonce, signed join) from accept, not each read: `expire`,
  called by the loop every WATCH_INTERVAL, shuts the late sockets down, and the loop closes them on their EOF;
- at most the gang's size + MAX_PENDING connections are unauthenticated at once (coordinator.py); one more evicts
  the oldest. A real member needs one round trip, but a whole gang that connects at once is pending for a moment
  (10,000 members: a fixed 2,048 evicted real members, who then retried; bench/coordinator_scale.py), so strangers
  get 2,048 sockets beyond the gang's own, and no threads;
- refusals are logged at most LOG_BURST per LOG_INTERVAL, the rest counted in one line when it ends.
"""

from __future__ import annotations

import socket
import threading
import time

TYPE_CHECKING = False  # typing's own, without importing typing (trainhook/launcher/__init__.py says why)
if TYPE_CHECKING:
    from typing import Callable

HANDSHAKE_DEADLINE = 10.0
MAX_PENDING = 2048
LOG_BURST = 5
LOG_INTERVAL = 30.0
WATCH_INTERVAL = 0.5


def _shut(sock: socket.socket) -> None:
    """Wake whoever reads `sock` (the coordinator's loop sees its EOF and closes it): shutdown, not close, so the
    socket is closed once, by its owner."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed by its thread


class PendingConnections:
    """The connections that have not authenticated yet, oldest first, each with its deadline."""

    def __init__(self, say: Callable[[str], None], deadline: float = HANDSHAKE_DEADLINE,
                 limit: int = MAX_PENDING, clock: Callable[[], float] = time.monotonic) -> None:
        self.say, self.deadline, self.limit, self.clock = say, deadline, limit, clock
        self.lock = threading.Lock()
        self.pending: dict[socket.socket, float] = {}
        self.logged, self.suppressed, self.window = 0, 0, float("-inf")

    def __len__(self) -> int:
        return len(self.pending)

    def add(self, sock: socket.socket) -> None:
        """Count `sock` as pending; evict the oldest pending one when there are too many."""
        with self.lock:
            evicted = next(iter(self.pending)) if len(self.pending) >= self.limit else None
            if evicted is not None:
                del self.pending[evicted]
            self.pending[sock] = self.clock() + self.deadline
        if evicted is not None:
            self.refused("(a pending connection)", f"more than {self.limit} connections were unauthenticated; "
                                                   "the oldest was closed")
            _shut(evicted)

    def done(self, sock: socket.socket) -> None:
        """`sock` authenticated, or its thread ended: no deadline any more."""
        with self.lock:
            self.pending.pop(sock, None)

    def expire(self) -> None:
        now = self.clock()
        with self.lock:
            late = [sock for sock, deadline in self.pending.items() if deadline <= now]
            for sock in late:
                del self.pending[sock]
        for sock in late:
            _shut(sock)
        if late:
            self.refused("(pending connections)", f"{len(late)} did not authenticate within {self.deadline:g} s")
        self.refused_flush()

    def refused(self, peer: str, why: str) -> None:
        """Log a refusal, at most LOG_BURST lines per LOG_INTERVAL; the rest are counted."""
        with self.lock:
            summary = self._roll()
            speak = self.logged < LOG_BURST
            if speak:
                self.logged += 1
            else:
                self.suppressed += 1
        if summary:
            self.say(summary)
        if speak:
            self.say(f"refused a connection from {peer}: {why}")

    def refused_flush(self) -> None:
        with self.lock:
            summary = self._roll()
        if summary:
            self.say(summary)

    def _roll(self) -> str | None:
        """Start a new log window when the last one ended; the line counting what it did not log (lock held)."""
        now = self.clock()
        if now - self.window < LOG_INTERVAL:
            return None
        summary = (f"refused {self.suppressed} more connections in the last {LOG_INTERVAL:g} s (not logged one "
                   "by one)") if self.suppressed else None
        self.window, self.logged, self.suppressed = now, 0, 0
        return summary
