"""The last lines of the training's output, kept so a finished gang can still be inspected (issue 25 item 2).

A finished StatefulSet gang is scaled to zero: its pods go, and the kubelet's logs with them. So the launcher
keeps the last lines its training printed (stdout and stderr, in the order they arrived) and the member sends
them with its exit report; the coordinator sends the failing rank's and its own with the outcome, and the
notary stores them on the workload (docs/use/gang-lifecycle.md, "What is kept").

The output still reaches the container's stdout and stderr unchanged and at once: a pump thread per stream
reads what the training writes into a pipe and writes every chunk on to the launcher's own fd 1 or 2 before it
looks at it (no buffering, no decoding, binary bytes as they are), then feeds the ring. Memory is bounded
whatever the training prints: LINES lines of at most LINE_BYTES each, and the text handed on is at most
TAIL_BYTES (UTF-8).

Standard library only, Python 3.8+ (it runs inside the user's image).
"""

from __future__ import annotations

import collections
import os
import threading

TYPE_CHECKING = False  # typing's own, without importing typing (trainhook/launcher/__init__.py says why)
if TYPE_CHECKING:
    from typing import Deque, Dict, List, Optional, Tuple

LINES = 40  # lines kept per member
LINE_BYTES = 1024  # a longer line keeps its first LINE_BYTES (so one long line never takes the whole tail)
TAIL_BYTES = 4096  # the text sent on: the last lines that fit in this many UTF-8 bytes
CHUNK = 65536
JOIN_TIMEOUT = 2.0  # how long the end of the output may take to arrive after the training exited


class Tail:
    """The last LINES complete lines of each stream, plus each stream's unfinished line (so stdout and stderr never
    splice into one line), numbered in the order they were read.

    The two streams are read by two threads, so a stream's lines may be read a little after the other's later
    ones (a traceback on stderr read before the last of stdout's flood): the text keeps each stream's own last
    lines first (up to half the lines and bytes each), then fills the rest with the most recent of either, so
    neither stream's end is ever pushed out by the other's."""

    def __init__(self, lines: int = LINES, line_bytes: int = LINE_BYTES, tail_bytes: int = TAIL_BYTES):
        self.line_bytes, self.tail_bytes, self.max_lines = line_bytes, tail_bytes, lines
        self.lines: Dict[str, Deque[Tuple[int, bytes]]] = {}
        self.partial: Dict[str, Tuple[int, bytes]] = {}
        self.count = 0
        self.lock = threading.Lock()

    def feed(self, stream: str, data: bytes) -> None:
        with self.lock:
            ring = self.lines.setdefault(stream, collections.deque(maxlen=self.max_lines))
            pending = self.partial.get(stream, (0, b""))[1] + data
            *complete, rest = pending.split(b"\n")
            for line in complete[-self.max_lines:]:
                self.count += 1
                ring.append((self.count, line[:self.line_bytes]))
            self.count += 1
            self.partial[stream] = (self.count, rest[:self.line_bytes])

    def text(self) -> str:
        """The kept lines as text (invalid UTF-8 replaced, control characters but tabs shown as '?', carriage
        returns dropped), in the order they were read, at most `lines` lines and TAIL_BYTES."""
        with self.lock:
            streams = {name: list(ring) + ([self.partial[name]] if self.partial.get(name, (0, b""))[1] else [])
                       for name, ring in self.lines.items()}
        entries = {name: [(seq, printable(raw)) for seq, raw in kept] for name, kept in streams.items()}
        chosen: Dict[int, str] = {}
        budget = [self.max_lines, self.tail_bytes]

        def take(seq: int, line: str, share: List[int]) -> bool:
            cost = len(line.encode("utf-8")) + 1
            if seq in chosen:
                return True
            if share[0] < 1 or budget[0] < 1 or cost > share[1] or cost > budget[1]:
                return False
            chosen[seq] = line
            for limits in (share, budget) if share is not budget else (budget,):
                limits[0] -= 1
                limits[1] -= cost
            return True

        for kept in entries.values():  # each stream's own end first
            share = [max(1, self.max_lines // max(1, len(entries))), self.tail_bytes // max(1, len(entries))]
            for seq, line in reversed(kept):
                if not take(seq, line, share):
                    break
        for seq, line in sorted((e for kept in entries.values() for e in kept), reverse=True):
            if not take(seq, line, budget):
                break
        if not chosen and any(entries.values()):  # one line longer than the whole budget: its end
            line = max(e for kept in entries.values() for e in kept)[1]
            return line.encode("utf-8")[-(self.tail_bytes - 1):].decode("utf-8", "ignore")
        return "\n".join(line for _, line in sorted(chosen.items()))


def printable(line: bytes) -> str:
    text = line.decode("utf-8", "replace").replace("\r", "")
    return "".join(c if c == "\t" or c >= " " and c != "\x7f" else "?" for c in text)


def write_while_read(fd: int, data: bytes) -> bool:
    """Write every byte to `fd`; False when it cannot take them any more (its reader is gone)."""
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except InterruptedError:
            continue
        except OSError:
            return False
        view = view[written:]
    return True


class Tee:
    """Pipes for a child's stdout and stderr, and the pump threads that pass them on to this process's fd 1 and 2
    and keep the tail. `child_fds()` go to Popen; `started()` closes this side's copies of them; `finish()` waits
    (bounded) for the output's end once the child has exited."""

    def __init__(self, tail: Optional[Tail] = None):
        self.tail = tail or Tail()
        self.pipes = [os.pipe(), os.pipe()]  # non-inheritable; Popen dup2()s the write ends onto 1 and 2
        self.threads: List[threading.Thread] = []

    def child_fds(self) -> tuple:
        return self.pipes[0][1], self.pipes[1][1]

    def started(self) -> None:
        """The child has its copies: close ours (so the pipes end when it does) and start pumping."""
        for (read, write), (target, name) in zip(self.pipes, ((1, "stdout"), (2, "stderr"))):
            os.close(write)
            thread = threading.Thread(target=self._pump, args=(read, target, name), daemon=True,
                                      name=f"training-{name}")
            thread.start()
            self.threads.append(thread)

    def abandon(self) -> None:
        """The child never started: close both ends of both pipes."""
        for read, write in self.pipes:
            for fd in (read, write):
                try:
                    os.close(fd)
                except OSError:
                    pass

    def finish(self, timeout: float = JOIN_TIMEOUT) -> None:
        """Wait until both streams ended (every process holding them is gone), at most `timeout` seconds: a
        daemon of the training's that keeps them open must not hold the gang up; its output still flows."""
        for thread in self.threads:
            thread.join(timeout)

    def _pump(self, read: int, target: int, name: str) -> None:
        passing = True
        try:
            while True:
                try:
                    data = os.read(read, CHUNK)
                except InterruptedError:
                    continue
                except OSError:
                    return
                if not data:
                    return
                if passing:
                    passing = write_while_read(target, data)  # first: the container's log sees it at once
                self.tail.feed(name, data)
        finally:
            os.close(read)
