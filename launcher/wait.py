"""`trainhook-launch wait`: the gang-wait init container. Block until the whole gang can find each other.

Why: a training process that starts before its peers' DNS records exist fails its first connect and often
never recovers (the Training Operator's most reported failure). The init container holds the training
container back until the gang is there, with a deadline, and says which peers are missing when it gives up.

- `dns`: every member's address resolves, its own included (that is the name its peers will dial). The
  headless Service publishes not-ready addresses, so this happens as soon as the pods exist.
- `tcp`: additionally every pod's gang-wait can reach every other's. Only init containers listen at this point
  (training containers start after them), so the barrier has its own port and never waits for the training
  port. It is symmetric and cannot deadlock: every pod listens and connects to every peer, and a pod is done
  when it has reached every peer AND every peer has reached it, so when it stops listening nobody still needs
  it. A pod counts a peer as having reached it once its answer is sent.
"""

from __future__ import annotations

import queue
import socket
import sys
import threading
import time
from dataclasses import replace
from typing import Callable, Iterable

from trainhook.launcher.gang import Gang, Peer

EXIT_FAILED = 1  # the gang did not assemble in time (the message names who), or the barrier port is taken
PROTOCOL = "trainhook-gang/1"
FIRST_DELAY, MAX_DELAY = 0.2, 5.0  # poll backoff: fast while the gang assembles, gentle on DNS afterwards
REPORT_EVERY = 30.0  # seconds between progress lines when nothing changes
CONNECT_TIMEOUT = 5.0


def say(message: str, err: bool = False) -> None:
    print(f"trainhook-launch wait: {message}", file=sys.stderr if err else sys.stdout, flush=True)


def describe(peers: Iterable[Peer], limit: int = 8) -> str:
    """A readable list of peers, cut at `limit` so a 512-pod gang does not print a page per line."""
    items = [str(p) for p in peers]
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


class Progress:
    """Prints a line when the set of missing peers changes, and every REPORT_EVERY seconds otherwise."""

    def __init__(self, what: str, total: int):
        self.what, self.total, self.last, self.at = what, total, None, 0.0

    def update(self, missing: list[Peer]) -> None:
        now = time.monotonic()
        key = tuple(p.rank for p in missing)
        if key != self.last or now - self.at >= REPORT_EVERY:
            self.last, self.at = key, now
            done = self.total - len(missing)
            say(f"{done}/{self.total} peers {self.what}" + (f"; waiting for {describe(missing)}" if missing else ""))


def resolves(address: str) -> bool:
    try:
        return bool(socket.getaddrinfo(address, None))
    except (OSError, UnicodeError):
        return False


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


def wait_dns(gang: Gang, timeout: float) -> list[Peer]:
    """Poll until every member's address resolves; return the members still unresolved at the deadline."""
    deadline, delay = time.monotonic() + timeout, FIRST_DELAY
    missing = list(gang.peers)
    progress = Progress("resolve", gang.size)
    while True:
        found = resolve_all([p.address for p in missing], max(0.1, deadline - time.monotonic()))
        missing = [p for p in missing if p.address not in found]
        progress.update(missing)
        left = deadline - time.monotonic()
        if not missing or left <= 0:
            return missing
        time.sleep(min(delay, left))
        delay = min(delay * 1.5, MAX_DELAY)


def hello(gang: Gang) -> bytes:
    """The line a pod sends a peer: gang identity first, so a stray connection from another gang is refused."""
    return f"{PROTOCOL} {gang.namespace} {gang.job_name} {gang.rank}\n".encode()


def read_line(conn: socket.socket, limit: int = 512) -> str:
    data = b""
    while b"\n" not in data and len(data) < limit:
        chunk = conn.recv(limit - len(data))
        if not chunk:
            break
        data += chunk
    return data.split(b"\n", 1)[0].decode("utf-8", "replace").strip()


def answer(gang: Gang, line: str) -> tuple[int | None, str]:
    """Judge a hello: (the peer's rank, our reply) for our gang, (None, refusal) for anything else."""
    parts = line.split()
    if len(parts) != 4 or parts[0] != PROTOCOL:
        return None, "no not-a-trainhook-hello"
    _, namespace, job, rank = parts
    if (namespace, job) != (gang.namespace, gang.job_name):
        return None, f"no other-gang {gang.namespace}/{gang.job_name}"
    if not rank.isdigit() or not 0 <= int(rank) < gang.size or int(rank) == gang.rank:
        return None, f"no bad-rank {rank}"
    return int(rank), f"ok {gang.rank}"


def why(error: OSError) -> str:
    if isinstance(error, socket.gaierror):
        return "its address does not resolve"
    if isinstance(error, ConnectionRefusedError):
        return "connection refused"
    if isinstance(error, (socket.timeout, TimeoutError)):
        return "connection timed out"
    return error.strerror or type(error).__name__


class Barrier:
    """The tcp barrier's state: who we reached, who reached us, and the last error per unreached peer."""

    def __init__(self, gang: Gang):
        self.gang = gang
        self.changed = threading.Condition()
        self.stop = threading.Event()
        self.reached: set[int] = set()
        self.reached_us: set[int] = set()
        self.errors: dict[int, str] = {}

    def missing(self) -> list[Peer]:
        with self.changed:
            return [p for p in self.gang.others if p.rank not in self.reached or p.rank not in self.reached_us]

    def _mark(self, group: set[int], rank: int) -> None:
        with self.changed:
            group.add(rank)
            self.changed.notify_all()

    def serve(self, server: socket.socket) -> None:
        """Accept connections until stopped; each is answered on its own thread so a silent one blocks nobody."""
        server.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = server.accept()
            except (socket.timeout, TimeoutError):
                continue
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.settimeout(CONNECT_TIMEOUT)
                rank, reply = answer(self.gang, read_line(conn))
                conn.sendall(reply.encode() + b"\n")
            except OSError:
                return
        if rank is not None:
            self._mark(self.reached_us, rank)

    def reach(self, peer: Peer) -> None:
        """Connect to `peer` until it answers for our gang with its own rank (or the barrier stops)."""
        delay = FIRST_DELAY
        while not self.stop.is_set():
            try:
                with socket.create_connection((peer.address, self.gang.gang_wait_port), CONNECT_TIMEOUT) as conn:
                    conn.settimeout(CONNECT_TIMEOUT)
                    conn.sendall(hello(self.gang))
                    reply = read_line(conn)
                if reply == f"ok {peer.rank}":
                    self._mark(self.reached, peer.rank)
                    return
                error = f"it answered {reply!r}" if reply else "it closed the connection"
            except OSError as e:
                error = why(e)
            with self.changed:
                self.errors[peer.rank] = error
            self.stop.wait(delay)
            delay = min(delay * 1.5, MAX_DELAY)


def listen(port: int) -> socket.socket:
    """Listen on every interface, IPv6 and IPv4 where the pod has both, IPv4 alone otherwise."""
    if socket.has_dualstack_ipv6():
        try:
            return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True, backlog=128)
        except OSError:
            pass  # IPv6 disabled in this pod's network: fall back to IPv4
    return socket.create_server(("", port), backlog=128)


def wait_tcp(gang: Gang, timeout: float) -> tuple[list[Peer], dict[int, str]]:
    """Run the barrier; return the peers still missing at the deadline and the last error reaching each."""
    barrier = Barrier(gang)
    if not gang.others:
        return [], {}
    server = listen(gang.gang_wait_port)
    say(f"listening on port {gang.gang_wait_port} as {gang.me}")
    threads = [threading.Thread(target=barrier.serve, args=(server,), daemon=True)]
    threads += [threading.Thread(target=barrier.reach, args=(p,), daemon=True) for p in gang.others]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    progress = Progress("reached both ways", gang.size - 1)
    try:
        while True:
            missing = barrier.missing()
            progress.update(missing)
            left = deadline - time.monotonic()
            if not missing or left <= 0:
                break
            with barrier.changed:
                barrier.changed.wait(min(left, REPORT_EVERY))
    finally:
        barrier.stop.set()
        threads[0].join(timeout=2)
        server.close()
    with barrier.changed:
        errors = {p.rank: why_missing(p, barrier) for p in missing}
    return missing, errors


def why_missing(peer: Peer, barrier: Barrier) -> str:
    reasons = []
    if peer.rank not in barrier.reached:
        reasons.append(f"cannot reach it: {barrier.errors.get(peer.rank, 'no answer yet')}")
    if peer.rank not in barrier.reached_us:
        reasons.append("it has not reached us")
    return "; ".join(reasons)


def elastic_wait_view(gang: Gang) -> Gang:
    """What an elastic gang's pod waits for: its first `min` members (the ones any size within min..max has),
    never all `max` it may grow to, which would not exist. A member beyond `min` (added by a scale-up, after the
    first members' init containers are done) cannot run the tcp barrier, nobody would answer it: it waits for
    their addresses to resolve instead, and torchrun's rendezvous lets it join the running gang."""
    low = gang.assembled_at
    mode = gang.gang_wait if gang.rank < low else "dns"
    if mode != gang.gang_wait:
        say(f"{gang.me} is beyond the elastic gang's first {low} members: waiting for their addresses (dns) "
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
    say(f"{gang.gang_wait}: waiting up to {gang.wait_timeout:g}s for {gang.size} members of "
        f"{gang.namespace}/{gang.job_name}")
    if gang.gang_wait == "dns":
        missing = wait_dns(gang, gang.wait_timeout)
        details = {p.rank: "its address does not resolve" for p in missing}
    else:
        try:
            missing, details = wait_tcp(gang, gang.wait_timeout)
        except OSError as e:  # the port is taken or not ours to bind: say so instead of a traceback
            say(f"cannot listen on port {gang.gang_wait_port}: {e.strerror or e}", err=True)
            return EXIT_FAILED
    if not missing:
        say("all peers are there")
        return 0
    listing = "; ".join(f"{p}: {details[p.rank]}" for p in missing[:8])
    more = f"; and {len(missing) - 8} more" if len(missing) > 8 else ""
    say(f"gave up after {gang.wait_timeout:g}s: {len(missing)} of {gang.size} members missing: {listing}{more}",
        err=True)
    return EXIT_FAILED
