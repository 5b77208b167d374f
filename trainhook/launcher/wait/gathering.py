"""Rank 0's side of the tcp gang wait (tcp.py is the mode, tcp_lines.py the protocol): one thread gathers every
member's connection in one selector, counts the members that prove themselves, and releases them all with `go`.
A module of its own because only rank 0 runs it, and it is the larger half of the mode.
"""

from __future__ import annotations

import selectors
import socket
import time

from trainhook.launcher.pod_view import GangView
from trainhook.launcher.reach import qualified, search_domain
from trainhook.launcher.wait.dns import CONNECT_TIMEOUT, REPORT_EVERY, Progress
from trainhook.launcher.wait.tcp_lines import (ADDRESS, KEY, TO_MEMBER, TO_RANK0, mac, missing_line, parse_hello,
                                               plain_ip)
from trainhook.launcher.wire import new_nonce, same_mac

LOOKUP_EVERY = 1.0  # rank 0 asks a member's name again at most this often (a hello from an address not known yet)


class Session:
    """One member's connection at rank 0: its rank once the hello named it, both nonces, lines signed so far."""

    __slots__ = ("since", "buffer", "rank", "member_nonce", "rank0_nonce", "proven", "sent")

    def __init__(self, since: float) -> None:
        self.since = since
        self.buffer = b""
        self.rank: int | None = None
        self.member_nonce = ""
        self.rank0_nonce = new_nonce()
        self.proven = False
        self.sent = 0


class Gathering:
    """Rank 0's side of the tcp barrier: one thread, every connection in one selector.

    A member counts while its connection is open and it has proven itself (the key's HMAC, or its address); a
    member that reconnects replaces its previous connection. When every member counts, each is sent `go`; a send
    that fails drops that member (it reconnects) and the gathering goes on. `key` b"": addresses are checked."""

    def __init__(self, gang: GangView, server: socket.socket, key: bytes = b""):
        self.gang, self.server, self.key = gang, server, key
        self.mode = KEY if key else ADDRESS
        self.selector = selectors.DefaultSelector()
        self.members: dict[int, socket.socket] = {}
        self.released: set[int] = set()  # sent `go`: they may be gone already, and count as there
        self.seen: set[int] = set()  # ever connected: one that left is named as such at the deadline
        self.sessions: dict[socket.socket, Session] = {}
        self.told_at = time.monotonic()
        self.domain = search_domain(gang.namespace)
        self.known: dict[int, tuple[set[str], float]] = {}  # rank -> (its name's addresses, when asked)

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
            for sock in list(self.sessions):
                sock.close()
            self.selector.close()

    def accept(self) -> None:
        for _ in range(64):  # take what the backlog holds, a bounded batch per turn
            try:
                sock, _ = self.server.accept()
            except OSError:  # BlockingIOError: the backlog is empty
                return
            sock.setblocking(False)
            self.sessions[sock] = Session(time.monotonic())
            self.selector.register(sock, selectors.EVENT_READ)

    def drop(self, sock: socket.socket) -> None:
        self.sessions.pop(sock, None)
        for rank, member in list(self.members.items()):
            if member is sock:
                del self.members[rank]
        try:
            self.selector.unregister(sock)
        except (KeyError, ValueError):
            pass
        sock.close()

    def send(self, sock: socket.socket, data: bytes) -> bool:
        """One short line on a non-blocking socket (signed for a proven member in `key` mode); a connection that
        cannot take it at once is dropped."""
        session = self.sessions.get(sock)
        if self.key and session is not None and session.proven:
            text = data.decode().rstrip("\n")
            tag = mac(self.key, TO_MEMBER, session.rank0_nonce, session.member_nonce, session.sent, text)
            data = f"{text} {tag}\n".encode()
            session.sent += 1
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
        session = self.sessions.get(sock)
        if not data or session is None:  # the member went away (its pod restarted, or a stray hung up)
            self.drop(sock)
            return
        if session.proven:
            return  # members say nothing after their proof
        session.buffer += data
        while b"\n" in session.buffer and sock in self.sessions and not session.proven:
            line, session.buffer = session.buffer.split(b"\n", 1)
            self.judge(sock, session, line.decode("utf-8", "replace").strip())
        if sock in self.sessions and not session.proven and len(session.buffer) >= 512:
            self.drop(sock)

    def judge(self, sock: socket.socket, session: Session, line: str) -> None:
        """The member's hello, then (`key` mode) its proof: refused with a `no` line and dropped, or counted."""
        if session.rank is None:
            hello = parse_hello(self.gang, line)
            if isinstance(hello, str):
                self.refuse(sock, hello)
                return
            session.rank, session.member_nonce = hello
            if self.mode == ADDRESS:
                ip = self.peer_ip(sock)
                if not self.from_member(session.rank, ip):
                    self.refuse(sock, f"no address {ip} is not where {self.gang.peers[session.rank].address} resolves")
                    return
            if not self.send(sock, f"ok {self.gang.rank} {session.rank0_nonce} {self.mode}\n".encode()):
                return
            if self.mode == KEY:
                return  # its proof comes next
        else:
            expected = mac(self.key, TO_RANK0, session.rank0_nonce, session.member_nonce, 0, f"member {session.rank}")
            word, _, proof = line.partition(" ")
            if word != "proof" or not same_mac(proof, expected):
                self.refuse(sock, "no proof: not signed with this gang's key")
                return
        self.count(sock, session)

    def refuse(self, sock: socket.socket, reply: str) -> None:
        try:
            sock.send(reply.encode() + b"\n")
        except OSError:
            pass
        self.drop(sock)

    @staticmethod
    def peer_ip(sock: socket.socket) -> str:
        try:
            return plain_ip(str(sock.getpeername()[0]))
        except OSError:
            return "?"

    def from_member(self, rank: int, ip: str) -> bool:
        """Whether `ip` is where member `rank`'s name resolves (asked again at most every LOOKUP_EVERY seconds:
        a member that restarted has a new address)."""
        addresses, asked = self.known.get(rank, (set(), 0.0))
        if ip in addresses:
            return True
        if time.monotonic() - asked < LOOKUP_EVERY:
            return False
        try:
            addresses = peer_addresses(qualified(self.gang.peers[rank].address, self.domain))
        except (OSError, UnicodeError):
            addresses = set()
        self.known[rank] = (addresses, time.monotonic())
        return ip in addresses

    def count(self, sock: socket.socket, session: Session) -> None:
        rank = session.rank
        assert rank is not None
        session.proven = True
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
        """Connections that did not prove themselves within CONNECT_TIMEOUT (a port scan, a stuck peer) are closed."""
        now = time.monotonic()
        for sock, session in list(self.sessions.items()):
            if not session.proven and now - session.since > CONNECT_TIMEOUT:
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


def peer_addresses(name: str) -> set[str]:
    return {plain_ip(str(info[4][0])) for info in socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)}
