"""The last lines of the training's output, kept so a finished gang can still be inspected (issue 25 item 2).

A finished StatefulSet gang is scaled to zero: its pods go, and the kubelet's logs with them. So the launcher
keeps the last lines its training printed (stdout and stderr, in the order they arrived) and the member sends
them with its exit report; the coordinator sends the failing rank's and its own with the outcome, and the
notary stores them on the workload (docs/gang-lifecycle.md, "What is kept").

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
from typing import Deque, Dict, List, Optional

LINES = 40  # lines kept per member
LINE_BYTES = 4096  # a longer line keeps its first LINE_BYTES
TAIL_BYTES = 4096  # the text sent on: the last lines that fit in this many UTF-8 bytes
CHUNK = 65536
JOIN_TIMEOUT = 2.0  # how long the end of the output may take to arrive after the training exited


class Tail:
    """A ring of the last LINES complete lines, plus each stream's unfinished line, fed by any number of streams
    (each keeps its own partial line, so stdout and stderr never splice into one line)."""

    def __init__(self, lines: int = LINES, line_bytes: int = LINE_BYTES, tail_bytes: int = TAIL_BYTES):
        self.line_bytes, self.tail_bytes = line_bytes, tail_bytes
        self.lines: Deque[bytes] = collections.deque(maxlen=lines)
        self.partial: Dict[str, bytes] = {}
        self.lock = threading.Lock()

    def feed(self, stream: str, data: bytes) -> None:
        with self.lock:
            pending = self.partial.get(stream, b"") + data
            *complete, rest = pending.split(b"\n")
            for line in complete[-(self.lines.maxlen or LINES):]:
                self.lines.append(line[:self.line_bytes])
            self.partial[stream] = rest[:self.line_bytes]

    def text(self) -> str:
        """The kept lines as text (invalid UTF-8 replaced, control characters but tabs shown as '?', carriage
        returns dropped), the unfinished lines last, cut from the front to TAIL_BYTES."""
        with self.lock:
            raw: List[bytes] = list(self.lines) + [p for p in self.partial.values() if p]
        lines = [printable(line) for line in raw]
        kept: List[str] = []
        size = 0
        for line in reversed(lines):
            cost = len(line.encode("utf-8")) + 1
            if size + cost > self.tail_bytes:
                if not kept:  # one line longer than the budget: its end
                    kept.append(line.encode("utf-8")[-(self.tail_bytes - 1):].decode("utf-8", "ignore"))
                break
            kept.append(line)
            size += cost
        return "\n".join(reversed(kept))


def printable(line: bytes) -> str:
    text = line.decode("utf-8", "replace").replace("\r", "")
    return "".join(c if c == "\t" or c >= " " and c != "\x7f" else "?" for c in text)


def write_all(fd: int, data: bytes) -> bool:
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
                    passing = write_all(target, data)  # first: the container's log sees it at once
                self.tail.feed(name, data)
        finally:
            os.close(read)
