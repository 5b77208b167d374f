"""`trainhook-launch wait`: the gang-wait init container. Block until the gang can form, at a cost that grows
linearly with the gang.

Why: a training process that starts before the names it dials resolve fails its first connect and often never
recovers (the Training Operator's most reported failure). The init container holds the training container back
until those names are there, with a deadline, and says which members are missing when it gives up.

Why not "every pod waits for every peer": that is N pods x N names per poll, O(N^2) queries against the cluster
DNS, which the whole cluster shares (issue 26: a 32-pod gang's waits took 21 s). A pod waits only for what it
will connect to; rank 0, the gang's gathering point, waits for the rest:

- `dns`: a member (rank > 0) waits until its own address (what peers dial: the MPI launcher, TF_CONFIG peers)
  and rank 0's (what it dials: the coordinator, MASTER_ADDR, the JAX coordinator) resolve. Rank 0 waits until
  every member's address resolves: it asks for the headless Service's name (one query per poll, answered with
  every published member's address) and resolves each member's own name only once the Service lists the whole
  gang, or every FULL_PASS_EVERY seconds. The headless Service publishes not-ready addresses, so this happens as
  soon as the pods exist. So with the launcher delivered, its coordinator barrier holds every training until all
  members have joined; without it (`trainhook.dev/launcher: none`), rank 0's training starts only once the whole
  gang exists, and the members' first connect (to rank 0) resolves.
- `tcp`: additionally a star barrier on its own port (training containers start after init containers, so the
  training port is never used): rank 0's wait listens, every member's wait connects to it and stays connected;
  when every member is connected rank 0 sends each of them `go`, and only then stops listening, so nobody still
  needs it. O(N) connections, one thread at rank 0 (selectors). A member learns who is missing from rank 0.

Every poll and every reconnect follows `Backoff` (launcher/reach.py, shared with the launcher's connection to the
coordinator): jittered, growing to a cap that starts low (the gang usually forms within seconds) and rises with
the time already waited, so a gang that waits minutes (a missing Service) does not keep the DNS server busy.
Names are asked as absolute names, and a member's tcp wait resolves rank 0 once and reuses the address.
"""

from __future__ import annotations

import queue
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable

from trainhook.launcher.gang import Gang, Peer
from trainhook.launcher.reach import (LISTED, Backoff, PeerAddress, connect, describe, listen, qualified, retry_floor,
                                     search_domain)
from trainhook.launcher.speak import speaker

# Backoff, the names, describe and listen: launcher/reach.py
__all__ = ["Backoff", "describe", "listen", "qualified", "search_domain", "wait"]

EXIT_FAILED = 1  # the gang did not assemble in time (the message names who), or the barrier port is taken
PROTOCOL = "trainhook-gang/2"  # /1 was the symmetric all-to-all barrier; a /1 hello is refused by name
MEMBER_FLOOR, GATHER_FLOOR = 0.5, 0.25  # the cap's starting value: rank 0's poll is one query, a member's two
FULL_PASS_EVERY = 10.0  # rank 0 resolves every missing member's name at least this often (see wait_gathering)
REPORT_EVERY = 30.0  # seconds between progress lines when nothing changes
CONNECT_TIMEOUT = 5.0


say = speaker("wait", to_stdout=True)


class Progress:
    """Prints a line when what is missing changes, and every REPORT_EVERY seconds otherwise."""

    def __init__(self, what: str, total: int):
        self.what, self.total, self.last, self.at = what, total, None, 0.0

    def update(self, done: int, missing: list[Peer] | None = None, note: str = "") -> None:
        now = time.monotonic()
        key = (done, tuple(p.rank for p in missing or ()), note)
        if key != self.last or now - self.at >= REPORT_EVERY:
            self.last, self.at = key, now
            line = f"{done}/{self.total} {self.what}" + (f" ({note})" if note else "")
            say(line + (f"; waiting for {describe(missing)}" if missing else ""))


@dataclass
class Result:
    """What a wait found: the members still missing at the deadline (empty: done), why each, and how many are
    missing in all when only some are named (a member's tcp wait knows the first LISTED of rank 0's list)."""

    missing: list[Peer] = field(default_factory=list)
    why: dict[int, str] = field(default_factory=dict)
    count: int = 0
    source: str = ""

    def __post_init__(self) -> None:
        self.count = max(self.count, len(self.missing))


def resolves(address: str) -> bool:
    try:
        return bool(socket.getaddrinfo(address, None))
    except (OSError, UnicodeError):
        return False


def addresses_of(name: str) -> set[str]:
    """The distinct addresses `name` resolves to (a headless Service: one per published member); empty if none."""
    try:
        return {info[4][0] for info in socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)}
    except (OSError, UnicodeError):
        return set()


def resolve_all(addresses: list[str], timeout: float, resolve: Callable[[str], bool] = resolves) -> set[str]:
    """The addresses that resolve, looked up in parallel on daemon threads.

    A lookup can hang for the resolver's whole retry budget (tens of seconds against an unreachable DNS server);
    parallel daemon threads keep one round bounded by `timeout`, so the deadline is kept.
    """
    results: queue.Queue[tuple[str, bool]] = queue.Queue()
    for address in addresses:
        threading.Thread(target=lambda a=address: results.put((a, resolve(a))), daemon=True).start()
    found: set[str] = set()
    end = time.monotonic() + timeout
    for _ in addresses:
        try:
            address, ok = results.get(timeout=max(0.0, end - time.monotonic()))
        except queue.Empty:
            break
        if ok:
            found.add(address)
    return found


def count_of(name: str, timeout: float, count: Callable[[str], set[str]] = addresses_of) -> int:
    """len(count(name)), bounded by `timeout` the same way (0 when the lookup does not answer in time)."""
    results: queue.Queue[int] = queue.Queue()
    threading.Thread(target=lambda: results.put(len(count(name))), daemon=True).start()
    try:
        return results.get(timeout=max(0.0, timeout))
    except queue.Empty:
        return 0


def targets(gang: Gang) -> list[Peer]:
    """What a member's dns wait resolves: its own address, then rank 0's (rank 0 waits for the whole gang)."""
    return [gang.me] + ([gang.peers[0]] if gang.rank != 0 else [])


def wait_names(peers: list[Peer], deadline: float, floor: float, progress: Progress | None,
               resolve: Callable[[str], bool] = resolves, domain: str | None = None) -> list[Peer]:
    """Poll until every one of `peers` resolves; return those still unresolved at the deadline."""
    missing, backoff = list(peers), Backoff(floor)
    while True:
        found = resolve_all([qualified(p.address, domain) for p in missing], max(0.1, deadline - time.monotonic()),
                            resolve)
        missing = [p for p in missing if qualified(p.address, domain) not in found]
        if progress is not None:
            progress.update(len(peers) - len(missing), missing)
        left = deadline - time.monotonic()
        if not missing or left <= 0:
            return missing
        time.sleep(min(backoff.next(), left))


def wait_gathering(gang: Gang, deadline: float, resolve: Callable[[str], bool] = resolves,
                   count: Callable[[str], set[str]] = addresses_of, domain: str | None = None) -> list[Peer]:
    """Rank 0's dns wait: until every member's address resolves, in O(1) queries per poll.

    Each poll asks for the headless Service (gang.subdomain), whose answer lists every published member: one
    query instead of N. Only when it lists at least the whole gang are the members' own names resolved (usually
    once; each resolved name is not asked again). The Service may answer fewer addresses than members that
    resolve (pods sharing an address, such as host-network pods on one node), so every FULL_PASS_EVERY seconds
    the missing names are resolved anyway: the wait can be late then, never stuck."""
    missing, backoff = list(gang.peers), Backoff(GATHER_FLOOR)
    progress = Progress("members' addresses resolve", gang.size)
    last_full = time.monotonic()
    while True:
        left = max(0.1, deadline - time.monotonic())
        listed = count_of(qualified(gang.subdomain, domain), left, count)
        now = time.monotonic()
        if listed >= gang.size or now - last_full >= FULL_PASS_EVERY or now >= deadline:
            last_full = now
            found = resolve_all([qualified(p.address, domain) for p in missing], left, resolve)
            missing = [p for p in missing if qualified(p.address, domain) not in found]
            progress.update(gang.size - len(missing), missing, f"Service {gang.subdomain} lists {listed}")
        else:
            progress.update(min(listed, gang.size), None, f"as the Service {gang.subdomain} lists them")
        left = deadline - time.monotonic()
        if not missing or left <= 0:
            return missing
        time.sleep(min(backoff.next(), left))


def wait_dns(gang: Gang, timeout: float) -> Result:
    deadline = time.monotonic() + timeout
    domain = search_domain(gang.namespace)
    if gang.rank == 0:
        missing = wait_gathering(gang, deadline, domain=domain)
        if not missing:
            say(f"every member's address resolves ({gang.size}/{gang.size})")
    else:
        mine = targets(gang)
        missing = wait_names(mine, deadline, MEMBER_FLOOR, Progress("of this pod's own and rank 0's addresses "
                                                                    "resolve", len(mine)), domain=domain)
    return Result(missing, {p.rank: "its address does not resolve" for p in missing})


# --- tcp: the star barrier --------------------------------------------------------------------------------------

def hello(gang: Gang) -> bytes:
    """The line a member sends rank 0: gang identity first, so a stray connection from another gang is refused."""
    return f"{PROTOCOL} {gang.namespace} {gang.job_name} {gang.rank}\n".encode()


def answer(gang: Gang, line: str) -> tuple[int | None, str]:
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


def why(error: OSError) -> str:
    if isinstance(error, socket.gaierror):
        return "its address does not resolve"
    if isinstance(error, ConnectionRefusedError):
        return "connection refused"
    if isinstance(error, (socket.timeout, TimeoutError)):
        return "connection timed out"
    return error.strerror or type(error).__name__


class Gathering:
    """Rank 0's side of the tcp barrier: one thread, every connection in one selector.

    A member counts while its connection is open and its hello was accepted; a member that reconnects replaces
    its previous connection. When every member counts, each is sent `go`; a send that fails drops that member
    (it reconnects) and the gathering goes on."""

    def __init__(self, gang: Gang, server: socket.socket):
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


def join_gathering(gang: Gang, deadline: float) -> Result:
    """A member's side of the tcp barrier: connect to rank 0's wait and stay until it says `go`."""
    rank0 = gang.peers[0]
    target = PeerAddress(rank0.address, search_domain(gang.namespace))  # asked once, not before every connect
    backoff, error, reported, floor = Backoff(MEMBER_FLOOR), "no answer yet", None, MEMBER_FLOOR
    joined_once = False
    while time.monotonic() < deadline:
        floor = MEMBER_FLOOR
        try:
            with connect(target, gang.gang_wait_port, CONNECT_TIMEOUT) as conn:
                conn.sendall(hello(gang))
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


def wait_tcp(gang: Gang, timeout: float) -> Result:
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


def elastic_wait_view(gang: Gang) -> Gang:
    """What an elastic gang's pod waits for: its first `min` members (the ones any size within min..max has),
    never all `max` it may grow to, which would not exist. A member beyond `min` (added by a scale-up, after the
    first members' init containers are done) cannot run the tcp barrier, nobody would answer it: it waits for
    its own and rank 0's addresses (dns) instead, and torchrun's rendezvous lets it join the running gang."""
    low = gang.assembled_at
    mode = gang.gang_wait if gang.rank < low else "dns"
    if mode != gang.gang_wait:
        say(f"{gang.me} is beyond the elastic gang's first {low} members: waiting for addresses (dns) "
            f"instead of the tcp barrier, which they ran at the gang's start")
    first = gang.peers[:low] + ((gang.me,) if gang.rank >= low else ())
    return replace(gang, peers=first, gang_wait=mode, elastic=None)


def wait(gang: Gang) -> int:
    """The `wait` command: 0 when the gang is assembled, EXIT_FAILED (and a message naming who) otherwise."""
    if gang.gang_wait == "none":
        say("gang wait is off (none); not waiting")
        return 0
    if gang.elastic:
        gang = elastic_wait_view(gang)
    if gang.rank == 0:
        what = f"all {gang.size} members"
    else:
        what = f"this pod's own address and rank 0's ({gang.peers[0].address}); rank 0 waits for the rest"
    say(f"{gang.gang_wait}: waiting up to {gang.wait_timeout:g}s for {what} of {gang.namespace}/{gang.job_name}")
    if gang.gang_wait == "dns":
        result = wait_dns(gang, gang.wait_timeout)
    else:
        try:
            result = wait_tcp(gang, gang.wait_timeout)
        except OSError as e:  # the port is taken or not ours to bind: say so instead of a traceback
            say(f"cannot listen on port {gang.gang_wait_port}: {e.strerror or e}", err=True)
            return EXIT_FAILED
    if not result.missing:
        say("all peers are there")
        return 0
    listing = "; ".join(f"{p}: {result.why[p.rank]}" for p in result.missing[:LISTED])
    more = f"; and {result.count - min(LISTED, len(result.missing))} more" if result.count > LISTED else ""
    source = f" ({result.source})" if result.source else ""
    say(f"gave up after {gang.wait_timeout:g}s: {result.count} of {gang.size} members missing{source}: "
        f"{listing}{more}", err=True)
    return EXIT_FAILED
