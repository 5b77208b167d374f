"""The gang wait's `tcp` mode: a star barrier on its own port, rank 0 gathering (wait.py says why and when).

Why a module of its own: the barrier's protocol (hello, `missing`, `go`), rank 0's one-thread gathering over a
selector and a member's reconnecting join are a third of the gang wait and are needed only in `tcp` mode; the
names it resolves first are wait_dns.py's, the command around it wait.py.
"""

from __future__ import annotations

import selectors
import socket
import time

from trainhook.launcher.pod_view import GangView
from trainhook.launcher.reach import (LISTED, Backoff, PeerAddress, connect_peer, describe, listen, retry_floor,
                                     search_domain, why)
from trainhook.launcher.wait.dns import CONNECT_TIMEOUT, MEMBER_FLOOR, REPORT_EVERY, Progress, Result, say, wait_names

PROTOCOL = "trainhook-gang/2"  # /1 was the symmetric all-to-all barrier; a /1 hello is refused by name


def barrier_hello(gang: GangView) -> bytes:
    """The line a member sends rank 0: gang identity first, so a stray connection from another gang is refused."""
    return f"{PROTOCOL} {gang.namespace} {gang.job_name} {gang.rank}\n".encode()


def answer(gang: GangView, line: str) -> tuple[int | None, str]:
    """Rank 0 judges a hello: (the member's rank, our reply) for our gang, (None, refusal) for anything else."""
    parts = line.split()
    if len(parts) != 4 or not parts[0].startswith("trainhook-gang/"):
        return None, "no not-a-trainhook-hello"
    if parts[0] != PROTOCOL:
        return None, f"no protocol {parts[0]}: this gang's rank 0 speaks {PROTOCOL} (a launcher of another version)"
    _, namespace, job, rank = parts
    if (namespace, job) != (gang.namespace, gang.job_name):
        return None, f"no other-gang {gang.namespace}/{gang.job_name}"
    if not rank.isdigit() or not 0 <= int(rank) < gang.size or int(rank) == gang.rank:
        return None, f"no bad-rank {rank}"
    return int(rank), f"ok {gang.rank}"


def missing_line(ranks: list[int]) -> bytes:
    """What rank 0 tells its connected members about the rest: `missing <count> <first LISTED ranks>`."""
    return f"missing {len(ranks)} {','.join(str(r) for r in ranks[:LISTED]) or '-'}\n".encode()


def parse_missing(line: str) -> tuple[int, list[int]] | None:
    parts = line.split()
    if len(parts) != 3 or parts[0] != "missing" or not parts[1].isdigit():
        return None
    ranks = [int(r) for r in parts[2].split(",") if r.isdigit()]
    return int(parts[1]), ranks


class Gathering:
    """Rank 0's side of the tcp barrier: one thread, every connection in one selector.

    A member counts while its connection is open and its hello was accepted; a member that reconnects replaces
    its previous connection. When every member counts, each is sent `go`; a send that fails drops that member
    (it reconnects) and the gathering goes on."""

    def __init__(self, gang: GangView, server: socket.socket):
        self.gang, self.server = gang, server
        self.selector = selectors.DefaultSelector()
        self.members: dict[int, socket.socket] = {}
        self.released: set[int] = set()  # sent `go`: they may be gone already, and count as there
        self.seen: set[int] = set()  # ever connected: one that left is named as such at the deadline
        self.pending: dict[socket.socket, tuple[bytes, float]] = {}  # hello not read yet: (bytes so far, since)
        self.told_at = time.monotonic()

    def missing(self) -> list[int]:
        return [p.rank for p in self.gang.others if p.rank not in self.members and p.rank not in self.released]

    def run(self, deadline: float) -> list[int]:
        """The ranks still missing at the deadline (empty: every member was sent `go`)."""
        server = self.server
        server.setblocking(False)
        self.selector.register(server, selectors.EVENT_READ)
        progress = Progress("members reached rank 0's gang wait", self.gang.size - 1)
        try:
            while True:
                missing = self.missing()
                progress.update(self.gang.size - 1 - len(missing), [self.gang.peers[r] for r in missing])
                if not missing and self.release():
                    return []
                missing = self.missing()
                left = deadline - time.monotonic()
                if left <= 0:
                    self.tell(missing_line(self.missing()))  # the members still waiting hear who is missing
                    return self.missing()
                for key, _ in self.selector.select(timeout=min(left, 1.0)):
                    if key.fileobj is server:
                        self.accept()
                    else:
                        self.read(key.fileobj)  # type: ignore[arg-type]
                self.expire()
                if time.monotonic() - self.told_at >= REPORT_EVERY:
                    self.tell(missing_line(self.missing()))
        finally:
            for sock in [*self.members.values(), *self.pending]:
                sock.close()
            self.selector.close()

    def accept(self) -> None:
        for _ in range(64):  # take what the backlog holds, a bounded batch per turn
            try:
                sock, _ = self.server.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            sock.setblocking(False)
            self.pending[sock] = (b"", time.monotonic())
            self.selector.register(sock, selectors.EVENT_READ)

    def drop(self, sock: socket.socket) -> None:
        self.pending.pop(sock, None)
        for rank, member in list(self.members.items()):
            if member is sock:
                del self.members[rank]
        try:
            self.selector.unregister(sock)
        except (KeyError, ValueError):
            pass
        sock.close()

    def send(self, sock: socket.socket, data: bytes) -> bool:
        """One short line on a non-blocking socket; a connection that cannot take it at once is dropped."""
        try:
            if sock.send(data) == len(data):
                return True
        except OSError:
            pass
        self.drop(sock)
        return False

    def read(self, sock: socket.socket) -> None:
        try:
            data = sock.recv(512)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the member went away (its pod restarted, or a stray hung up)
            self.drop(sock)
            return
        if sock not in self.pending:
            return  # members say nothing after their hello
        buffer, since = self.pending[sock]
        buffer += data
        if b"\n" not in buffer and len(buffer) < 512:
            self.pending[sock] = (buffer, since)
            return
        del self.pending[sock]
        rank, reply = answer(self.gang, buffer.split(b"\n", 1)[0].decode("utf-8", "replace").strip())
        if not self.send(sock, reply.encode() + b"\n"):
            return
        if rank is None:
            self.drop(sock)
            return
        previous = self.members.get(rank)
        if previous is not None and previous is not sock:
            self.drop(previous)
        if rank in self.released:  # released already, and back (its init container restarted): go again
            self.send(sock, b"go\n")
            return
        self.members[rank] = sock
        self.seen.add(rank)
        self.send(sock, missing_line(self.missing()))

    def expire(self) -> None:
        """Connections that sent no hello within CONNECT_TIMEOUT (a port scan, a stuck peer) are closed."""
        now = time.monotonic()
        for sock, (_, since) in list(self.pending.items()):
            if now - since > CONNECT_TIMEOUT:
                self.drop(sock)

    def tell(self, data: bytes) -> None:
        self.told_at = time.monotonic()
        for sock in list(self.members.values()):
            self.send(sock, data)

    def release(self) -> bool:
        """Send every connected member `go`; False when one could not take it (it was dropped, and is waited for
        again: it reconnects, and is sent `go` at once, since the others were released)."""
        for rank, sock in list(self.members.items()):
            if self.send(sock, b"go\n"):
                self.released.add(rank)
        return not self.missing()


class Deadline(Exception):
    """The wait's deadline came while reading from rank 0."""


class Lines:
    """Lines from a socket read under a deadline (socket.makefile cannot be read again after a timeout)."""

    def __init__(self, sock: socket.socket):
        self.sock, self.buffer = sock, b""

    def read(self, deadline: float) -> str | None:
        """The next line; None when the peer closed the connection; Deadline at the deadline."""
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Deadline()
            self.sock.settimeout(min(left, 1.0))
            try:
                chunk = self.sock.recv(512)
            except socket.timeout:
                continue
            if not chunk:
                return None
            self.buffer += chunk
            if len(self.buffer) > 4096:
                raise ConnectionError("rank 0 sent an overlong line")
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode("utf-8", "replace").strip()


def join_gathering(gang: GangView, deadline: float) -> Result:
    """A member's side of the tcp barrier: connect to rank 0's wait and stay until it says `go`."""
    rank0 = gang.peers[0]
    target = PeerAddress(rank0.address, search_domain(gang.namespace))  # asked once, not before every connect
    backoff, error, reported, floor = Backoff(MEMBER_FLOOR), "no answer yet", None, MEMBER_FLOOR
    joined_once = False
    while time.monotonic() < deadline:
        floor = MEMBER_FLOOR
        try:
            with connect_peer(target, gang.gang_wait_port, CONNECT_TIMEOUT) as conn:
                conn.sendall(barrier_hello(gang))
                lines = Lines(conn)
                reply = lines.read(min(deadline, time.monotonic() + CONNECT_TIMEOUT))
                if reply != f"ok {rank0.rank}":
                    raise ConnectionError(f"it answered {reply!r}" if reply else "it closed the connection")
                if not joined_once:
                    say(f"reached rank 0's gang wait ({rank0}); waiting for it to gather the gang")
                    joined_once = True
                while True:
                    line = lines.read(deadline)
                    if line is None:
                        raise ConnectionError("rank 0 closed the connection before every member was there")
                    if line == "go":
                        return Result()
                    parsed = parse_missing(line)
                    if parsed is not None:
                        reported = parsed
                        if parsed[0]:
                            say(f"rank 0 waits for {parsed[0]} member(s): "
                                f"{describe([gang.peers[r] for r in parsed[1] if r < gang.size])}"
                                + (" ..." if parsed[0] > len(parsed[1]) else ""))
        except Deadline:
            break
        except ConnectionRefusedError as e:
            error, floor = why(e), retry_floor(e, MEMBER_FLOOR)
        except ConnectionError as e:  # ours (what rank 0 answered) or a reset
            error = str(e) or why(e)
            target.lost()  # rank 0's pod may have restarted, with another address: ask its name again
        except OSError as e:
            error = why(e)
        time.sleep(max(0.0, min(backoff.next(floor), deadline - time.monotonic())))
    if reported is not None and reported[0]:
        peers = [gang.peers[r] for r in reported[1] if r < gang.size]
        return Result(peers, {p.rank: "it has not reached rank 0's gang wait" for p in peers}, reported[0],
                      "as rank 0 last reported")
    if joined_once:
        return Result([rank0], {rank0.rank: "it did not release the gang (the others were there, as far as this "
                                            "member heard)"})
    return Result([rank0], {rank0.rank: f"cannot reach it: {error}"})


def wait_tcp(gang: GangView, timeout: float) -> Result:
    """The star barrier (rank 0 gathers; raises OSError when rank 0 cannot listen on the port)."""
    deadline = time.monotonic() + timeout
    if not gang.others:
        return Result()
    if gang.rank != 0:
        mine = wait_names([gang.me], deadline, MEMBER_FLOOR, None, domain=search_domain(gang.namespace))
        if mine:
            return Result(mine, {gang.rank: "this pod's own address does not resolve"})
        return join_gathering(gang, deadline)
    server = listen(gang.gang_wait_port)
    say(f"listening on port {gang.gang_wait_port} as {gang.me}: every member connects here")
    gathering = Gathering(gang, server)
    missing = sorted(gathering.run(deadline), key=lambda r: (r in gathering.seen, r))  # never-seen ones first
    peers = [gang.peers[r] for r in missing]
    return Result(peers, {r: "it reached rank 0's gang wait, then left (its own deadline, or its pod restarted)"
                          if r in gathering.seen else "it has not reached rank 0's gang wait" for r in missing})

