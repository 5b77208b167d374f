"""The gang wait's `tcp` mode: a star barrier on its own port, rank 0 gathering (wait.py says why and when); a
module of its own because the barrier (hello, `missing`, `go`, rank 0's one-thread selector, a member's
reconnecting join) is needed only in `tcp` mode.

Who counts as a member (issue 31: a forged hello from a non-member released rank 0's barrier). Both ends pick a
fresh nonce per connection; how a member proves itself depends on what the wait holds:
- `key`: the gang's key, from the notary as the coordinator gets it (notary_client: the pod's identity token), when
  the webhook named a notary in this container. The member sends HMAC(key, both nonces, its rank), and every line
  rank 0 sends then (`missing`, `go`) carries an HMAC under both nonces and a line number (as wire.py signs the
  coordinator's, under this protocol's name): nobody without the key counts, releases a member, or replays a line.
- `address`: no notary named here (today the webhook gives the identity token to the training container only).
  Rank 0 counts a hello only from the address the claimed member's own name resolves to (its headless Service
  record): a pod elsewhere cannot answer for a member; one that takes over a member's address or record can. A
  member trusts the address it dialled.

    member -> rank 0   trainhook-gang/3 NAMESPACE JOB RANK NM
    rank 0 -> member   ok RANK0 NC MODE  |  no WHY
    member -> rank 0   proof HMAC(key, m2c|NC|NM|0|member RANK)                          (`key` only)
    rank 0 -> member   missing COUNT RANKS [MAC] ... go [MAC]     MAC = HMAC(key, c2m|NC|NM|n|LINE), `key` only
A member refuses a rank 0 of the other mode: a `key` member is never released by an unsigned `go`.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import selectors
import socket
import time
from dataclasses import dataclass, field

from trainhook.launcher import notary_client
from trainhook.launcher.pod_view import GangView
from trainhook.launcher.wire import same_mac
from trainhook.launcher.reach import (LISTED, Backoff, PeerAddress, connect_peer, describe, listen, qualified,
                                     retry_floor, search_domain, why)
from trainhook.launcher.wait.dns import CONNECT_TIMEOUT, MEMBER_FLOOR, REPORT_EVERY, Progress, Result, say, wait_names

PROTOCOL = "trainhook-gang/3"  # /2 counted any hello (issue 31); /1 was the symmetric all-to-all barrier
KEY, ADDRESS = "key", "address"
TO_RANK0, TO_MEMBER = "m2c", "c2m"
LOOKUP_EVERY = 1.0  # rank 0 asks a member's name again at most this often (a hello from an address not known yet)


def gang_wait_key(gang: GangView, deadline: float, env=os.environ) -> bytes:
    """The gang's key when the webhook named a notary in this container (asked until `deadline`), else b"":
    the wait then checks addresses. NotaryError when a notary is named and gives none."""
    notary = notary_client.from_env(env)
    if notary is None:
        return b""
    return notary.gang_key(gang.namespace, gang.job_name, max(1.0, deadline - time.monotonic()), say)


def mac(key: bytes, direction: str, rank0_nonce: str, member_nonce: str, number: int, text: str) -> str:
    message = "|".join((PROTOCOL, direction, rank0_nonce, member_nonce, str(number), text))
    return hmac.new(key, message.encode(), hashlib.sha256).hexdigest()


def plain_ip(address: str) -> str:
    return address[len("::ffff:"):] if address.startswith("::ffff:") and "." in address else address


@dataclass
class Session:
    """One member's connection at rank 0: its rank once the hello named it, both nonces, lines signed so far."""

    since: float
    buffer: bytes = b""
    rank: int | None = None
    member_nonce: str = ""
    rank0_nonce: str = field(default_factory=lambda: secrets.token_hex(16))
    proven: bool = False
    sent: int = 0


def barrier_hello(gang: GangView, member_nonce: str) -> bytes:
    """The line a member sends rank 0: gang identity first, so a stray connection from another gang is refused."""
    return f"{PROTOCOL} {gang.namespace} {gang.job_name} {gang.rank} {member_nonce}\n".encode()


def parse_hello(gang: GangView, line: str) -> tuple[int, str] | str:
    """Rank 0 reads a hello: (the member's rank, its nonce) for our gang, else the refusal (`no ...`) to answer."""
    parts = line.split()
    if not parts or not parts[0].startswith("trainhook-gang/"):
        return "no not-a-trainhook-hello"
    if parts[0] != PROTOCOL or len(parts) != 5:
        return f"no protocol {parts[0]}: this gang's rank 0 speaks {PROTOCOL} (a launcher of another version)"
    _, namespace, job, rank, member_nonce = parts
    if (namespace, job) != (gang.namespace, gang.job_name):
        return f"no other-gang {gang.namespace}/{gang.job_name}"
    if not rank.isdigit() or not 0 <= int(rank) < gang.size or int(rank) == gang.rank:
        return f"no bad-rank {rank}"
    if len(member_nonce) < 16:
        return "no nonce"
    return int(rank), member_nonce


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


def rank0_nonce(reply: str | None, rank0: int, mode: str) -> str:
    """Rank 0's nonce from its `ok` to our hello; ConnectionError for a refusal, or a rank 0 of the other mode."""
    parts = (reply or "").split()
    if len(parts) != 4 or parts[:2] != ["ok", str(rank0)]:
        raise ConnectionError(f"it answered {reply!r}" if reply else "it closed the connection")
    if parts[3] != mode:
        raise ConnectionError(f"it checks members by {parts[3]}, this member proves itself by {mode} (the pods were "
                              "admitted differently: a notary named in one gang-wait container and not the other)")
    return parts[2]


def signed_line(line: str | None, key: bytes, theirs: str, mine: str, number: int) -> str | None:
    """A line from rank 0 without its MAC, checked (`key` mode); ConnectionError for one rank 0 did not sign."""
    if line is None or not key:
        return line
    text, _, tag = line.rpartition(" ")
    if not same_mac(tag, mac(key, TO_MEMBER, theirs, mine, number, text)):
        raise ConnectionError(f"a line not signed with the gang's key came from rank 0's address: {text[:40]!r}")
    return text


def join_gathering(gang: GangView, deadline: float, key: bytes = b"") -> Result:
    """A member's side of the tcp barrier: connect to rank 0's wait, prove it is a member (the key's HMAC, or
    its address) and stay until rank 0 says `go` (signed, with a key)."""
    rank0 = gang.peers[0]
    target = PeerAddress(rank0.address, search_domain(gang.namespace))  # asked once, not before every connect
    backoff, error, reported, floor = Backoff(MEMBER_FLOOR), "no answer yet", None, MEMBER_FLOOR
    joined_once = False
    while time.monotonic() < deadline:
        floor = MEMBER_FLOOR
        try:
            with connect_peer(target, gang.gang_wait_port, CONNECT_TIMEOUT) as conn:
                mine = secrets.token_hex(16)
                conn.sendall(barrier_hello(gang, mine))
                lines = Lines(conn)
                theirs = rank0_nonce(lines.read(min(deadline, time.monotonic() + CONNECT_TIMEOUT)), rank0.rank,
                                     KEY if key else ADDRESS)
                if key:
                    conn.sendall(f"proof {mac(key, TO_RANK0, theirs, mine, 0, f'member {gang.rank}')}\n".encode())
                number = 0
                if not joined_once:
                    say(f"reached rank 0's gang wait ({rank0}); waiting for it to gather the gang")
                    joined_once = True
                while True:
                    line = signed_line(lines.read(deadline), key, theirs, mine, number)
                    number += 1
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
    try:
        key = gang_wait_key(gang, deadline)
    except notary_client.NotaryError as e:
        return Result([gang.me], {gang.rank: f"this pod has no gang key for the tcp barrier: {e}"})
    if gang.rank != 0:
        mine = wait_names([gang.me], deadline, MEMBER_FLOOR, None, domain=search_domain(gang.namespace))
        if mine:
            return Result(mine, {gang.rank: "this pod's own address does not resolve"})
        return join_gathering(gang, deadline, key)
    server = listen(gang.gang_wait_port)
    say(f"listening on port {gang.gang_wait_port} as {gang.me}: every member connects here (and proves it is one "
        + ("with the gang's key)" if key else "by its address: no notary is named in this container)"))
    gathering = Gathering(gang, server, key)
    missing = sorted(gathering.run(deadline), key=lambda r: (r in gathering.seen, r))  # never-seen ones first
    peers = [gang.peers[r] for r in missing]
    return Result(peers, {r: "it reached rank 0's gang wait, then left (its own deadline, or its pod restarted)"
                          if r in gathering.seen else "it has not reached rank 0's gang wait" for r in missing})
