"""The processes of bench/gang_scale_sim.py: many simulated members in one process, or rank 0 with the coordinator.

What a member does centrally is the launcher's own code: its credential from the notary (launcher/notary_client.py
`NotaryClient.gang_key`, with its pod's TokenRequest token, a TLS connection per call as in a pod), and its link to
rank 0's coordinator (launcher/coordination/link.py `Link`). What it does not do is run a training process per
member (10,000 processes on 2 cores): a member answers the coordinator's directives as MemberLauncher does with a
training that starts at once and stops at once (`start` -> running, `stop` -> stopped with 143, `done` ->
acknowledged), and the parent tells one member to fail (exit 137, a training killed: restart-gang retries it) and
every member to finish (exit 0).

A Link is a thread per member, as in a pod; 10,000 of them (in 20 processes) woke at once on every broadcast and
the machine ran out (docs/develop/performance.md). So the simulated members keep the Link object but not its
thread: the link's own `_connect` (connect, greeting and nonces, the signed join, the checked welcome) runs on a
small pool, its own `update` sends reports (signed by its wire.Channel), and what its thread would do, a blocking
read of the next checked message, is one `selectors` loop for the process that hands each socket's bytes to that
member's own wire.Channel (`receive`: order, signature) and puts what it says on the member's queue as Link.run
does. Re-implemented here, and only here: that read loop and the reconnect after a loss (Link.run's: the target
forgotten, `_connect` again with the same backoff). Rank 0's own member runs the real Link thread.

    python bench/gang_scale_members.py members --gang FILE --ranks A:B --tokens DIR --go-at T
    python bench/gang_scale_members.py coordinator --gang FILE --tokens DIR

Commands come on stdin, one a line (`fail RANK`, `finish`, `quit`); what happened goes to stdout as JSON lines
({"event": ...}), with wall-clock times (every process is on one machine).
"""

from __future__ import annotations

import argparse
import json
import queue
import selectors
import socket
import ssl
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trainhook.launcher import ending  # noqa: E402
from trainhook.launcher import wire  # noqa: E402
from trainhook.launcher.coordination.link import LINK_FLOOR, Link, describe_error  # noqa: E402
from trainhook.launcher.coordination.report import DONE, EXITED, RUNNING, STOPPED, Report  # noqa: E402
from trainhook.launcher.notary_client import NotaryClient  # noqa: E402
from trainhook.launcher.outcome import Outcome  # noqa: E402
from trainhook.launcher.pod_view import GangView, parse_gang  # noqa: E402
from trainhook.launcher.policy import LaunchSettings, read_settings  # noqa: E402
from trainhook.launcher.reach import Backoff, retry_floor  # noqa: E402

threading.stack_size(256 * 1024)  # small stacks for the pools' threads
CONNECTING = 4  # members of a process connecting to the coordinator at once (the pool that runs Link._connect)


EMIT = threading.Lock()


def emit(event: str, **fields) -> None:
    """One JSON line to the parent, whole (members' threads emit at once)."""
    line = json.dumps({"event": event, **fields}) + "\n"
    with EMIT:
        sys.stdout.write(line)
        sys.stdout.flush()


def changed(value, **changes):
    """A copy of a Peer or a Report (plain classes with __slots__, whose __init__ takes every slot, and no replace
    of their own: GangView and LaunchSettings have theirs) with `changes`, as dataclasses.replace made one."""
    kind = type(value)
    return kind(**{**{name: getattr(value, name) for name in kind.__slots__}, **changes})


def load_gang(path: str, port: int) -> tuple[GangView, LaunchSettings]:
    """Rank 0's pod's environment as the webhook admitted it, its coordinator on loopback at `port`."""
    env = json.loads(Path(path).read_text())
    gang = parse_gang(env)
    peers = (changed(gang.peers[0], address="127.0.0.1"),) + gang.peers[1:]
    gang = gang.replace(peers=peers)
    return gang, read_settings(env, gang).replace(port=port)


def as_rank(gang: GangView, rank: int) -> GangView:
    """The same gang seen from another member's pod (its peers tuple shared, not copied: 10,000 members)."""
    peer = gang.peers[rank]
    return gang.replace(role=peer.role, index=peer.index, rank=rank, address=peer.address)


class Tagged:
    """A Link's event queue that tags each event with its member's rank, into one queue for the process."""

    def __init__(self, rank: int, into: queue.SimpleQueue):
        self.rank, self.into = rank, into

    def put(self, event: tuple) -> None:
        self.into.put((self.rank, event))


class PodClient(NotaryClient):
    """The launcher's NotaryClient, connecting from `address`: in a cluster each member's pod has its own address
    (the notary bounds connections per source address, webhook/connections.py); loopback's 127/8 gives each
    simulated member one. The connection, request and answer are NotaryClient's own."""

    sources: list[str] = []  # the address of every connection made (the parent checks the members used theirs)

    def __init__(self, *args, address: str = "", **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.source_address = (address, 0) if address else None

    def connection(self) -> ssl.SSLSocket:
        tls = super().connection()
        PodClient.sources.append(tls.getsockname()[0])
        return tls


def pod_address(rank: int) -> str:
    """A loopback address of its own for each rank (127.100.0.1 up: not the notary's 127.0.0.1)."""
    return f"127.100.{rank // 250}.{rank % 250 + 1}"


class Members:
    """Simulated members: each a NotaryClient and a Link. With `looped` (the simulated members' processes) the
    links' sockets are read by one selectors loop; without (rank 0's own member) each Link runs its own thread,
    as in a pod. One thread answers every member's directives."""

    def __init__(self, gang: GangView, settings: LaunchSettings, ranks: range, tokens: Path, threads: int = 1,
                 own_addresses: bool = True, looped: bool = True):
        self.gang, self.settings, self.ranks, self.tokens = gang, settings, ranks, tokens
        self.threads = threads  # members of this process asking the notary at once
        self.own_addresses = own_addresses  # each member from its own address, as pods are (else all 127.0.0.1)
        self.looped = looped
        # One TLS client context for the process's members: a pod's launcher makes its own once, on its own node's
        # CPU (~0.3 ms); made per simulated member it was CPU of this machine's two cores the real notary shares.
        self.tls = ssl.create_default_context(cadata=settings.notary_ca)
        self.events: queue.SimpleQueue = queue.SimpleQueue()
        self.links: dict[int, Link] = {}
        self.reports: dict[int, Report] = {}
        self.times: dict[str, dict[int, float]] = {}
        self.lock = threading.Lock()
        self.failures: list[str] = []
        self.retries: list[str] = []  # the launcher's "waiting for the gang's key" lines: the notary said not yet
        self.lost: list[str] = []  # every connection to the coordinator lost mid-run: "rank: why"
        self.connect_errors: list[str] = []  # every failed Link._connect (retried)
        self.fresh: queue.SimpleQueue = queue.SimpleQueue()  # (rank, channel) connected, for the loop to read
        self.connector = ThreadPoolExecutor(CONNECTING) if looped else None
        self.closing = threading.Event()  # `quit`: the run is over, rank 0's coordinator going away is no loss
        if looped:
            self.selector = selectors.DefaultSelector()
            self.wake_loop, self.woken = socket.socketpair()

    def mark(self, what: str, rank: int) -> None:
        with self.lock:
            seen = self.times.setdefault(what, {})
            if rank in seen:
                return
            seen[rank] = time.time()
            complete = len(seen) == len(self.ranks)
        if complete:
            reasons = sorted({line[:160] for line in self.retries})[:3] if what == "key" else []
            emit("all", what=what, first=min(seen.values()), last=max(seen.values()), retries=len(self.retries),
                 reasons=reasons)

    def join(self, rank: int) -> None:
        """What a member's launcher does at its start: the key from the notary, then the link to rank 0."""
        notary = PodClient(self.settings.notary_url, self.settings.notary_ca,
                           token_file=str(self.tokens / f"{rank}.token"),
                           address=pod_address(rank) if self.own_addresses else "", context=self.tls)
        self.mark("asked", rank)
        try:
            key = notary.gang_key(self.gang.namespace, self.gang.job_name, 300, log=self.retries.append)
        except Exception as e:  # noqa: BLE001 - counted and said by the parent
            self.failures.append(f"rank {rank}: {e}")
            emit("failed", rank=rank, why=str(e)[:300])
            return
        self.mark("key", rank)
        report = self.reports[rank] = Report()
        link = Link(as_rank(self.gang, rank), self.settings.replace(key=key), Tagged(rank, self.events), report)
        self.links[rank] = link
        if self.connector is not None:
            self.connector.submit(self.connect, rank)
        else:
            link.start()

    def connect(self, rank: int) -> None:
        """Link.run's connecting part, on the pool: the link's own _connect, retried with its backoff."""
        link, backoff = self.links[rank], Backoff(LINK_FLOOR)
        while True:
            try:
                channel = link._connect()  # queues ("connected",) and the welcome, as in a pod
                break
            except (OSError, wire.RejectedMessage, ValueError) as e:
                self.connect_errors.append(f"{rank}: {describe_error(e)}")
                time.sleep(backoff.next(retry_floor(e, LINK_FLOOR)))
        self.fresh.put((rank, channel))
        self.wake_loop.send(b"x")

    def loop(self) -> None:
        """What every Link thread of the process would do, for all of them: read each connection's next messages,
        checked by its own wire.Channel, onto the member's queue; a lost connection is connected again."""
        self.selector.register(self.woken, selectors.EVENT_READ, None)
        while True:
            for key, _ in self.selector.select():
                if key.data is None:
                    self.woken.recv(4096)
                    while not self.fresh.empty():
                        rank, channel = self.fresh.get()
                        self.selector.register(channel.sock, selectors.EVENT_READ, (rank, channel))
                        self.read(rank, channel, b"")  # what _connect's reader took in past the welcome
                    continue
                rank, channel = key.data
                try:
                    chunk = channel.sock.recv(65536)
                except OSError as e:
                    self.drop(rank, channel, describe_error(e))
                    continue
                if not chunk:
                    self.drop(rank, channel, "the connection closed")
                else:
                    self.read(rank, channel, chunk)

    def read(self, rank: int, channel: wire.Channel, chunk: bytes) -> None:
        channel.reader.buffer += chunk
        try:
            while b"\n" in channel.reader.buffer:  # a whole line: Channel.receive reads it without a recv
                body = channel.receive()
                self.events.put((rank, ("directive", body)))
        except wire.RejectedMessage as e:
            self.drop(rank, channel, f"refused a message from the coordinator: {e}")

    def drop(self, rank: int, channel: wire.Channel, why: str) -> None:
        """Link.run after a lost connection: forget it, tell the member, connect again."""
        self.selector.unregister(channel.sock)
        if self.closing.is_set():
            channel.close()
            return
        link = self.links[rank]
        with link.lock:
            link.channel = None
        channel.close()
        link.target.lost()
        self.events.put((rank, ("lost", why)))
        assert self.connector is not None
        self.connector.submit(self.connect, rank)

    def start(self) -> None:
        threading.Thread(target=self.answer, daemon=True, name="members").start()
        if self.looped:
            threading.Thread(target=self.loop, daemon=True, name="links").start()
        pool = ThreadPoolExecutor(max(1, min(self.threads, len(self.ranks))))
        for rank in self.ranks:
            pool.submit(self.join, rank)
        pool.shutdown(wait=False)

    def update(self, rank: int, report: Report) -> None:
        self.reports[rank] = report
        self.links[rank].update(report)

    def answer(self) -> None:
        """The members' directives, answered as MemberLauncher.directive does with a training that starts and
        stops at once."""
        while True:
            rank, event = self.events.get()
            if event[0] == "connected":
                self.mark("joined", rank)
            if event[0] == "lost":
                self.lost.append(f"{rank}: {event[1]}")
            if event[0] != "directive":
                continue
            body, report = event[1], self.reports[rank]
            kind = body.get("type")
            if kind == "start" and report.status != RUNNING:
                attempt = int(body["attempt"])
                self.update(rank, Report(attempt, RUNNING, None, int(body.get("restarts", 0)), body.get("since")))
                self.mark(f"start{attempt}", rank)
            elif kind == "stop" and report.status == RUNNING and report.attempt == body.get("attempt"):
                self.update(rank, changed(report, status=STOPPED, code=143))
                self.mark(f"stop{report.attempt}", rank)
            elif kind == "done":
                outcome = Outcome.from_dict(body["outcome"])
                self.update(rank, changed(report, status=DONE, outcome=outcome.to_dict()))
                self.mark("done", rank)

    def command(self, words: list[str]) -> None:
        if words[0] == "fail":  # a member's training killed (exit 137): restart-gang retries a signal
            rank = int(words[1])
            self.mark("fail", rank)
            self.update(rank, changed(self.reports[rank], status=EXITED, code=137))
        elif words[0] == "finish":  # every member finished its part (exit 0)
            for rank in self.ranks:
                self.update(rank, changed(self.reports[rank], status=EXITED, code=0))
                self.mark("finish", rank)

    def summary(self) -> dict:
        """How many of this process's members went through each phase, and what went wrong on the way."""
        self.closing.set()
        with self.lock:
            counts = {what: len(seen) for what, seen in self.times.items()}
        return {"counts": counts, "lost": len(self.lost), "lost_why": self.lost[:5],
                "connect_errors": len(self.connect_errors), "connect_errors_why": self.connect_errors[:5],
                "failures": self.failures[:5], "notary_source_addresses": len(set(PodClient.sources))}


def run_members(args) -> int:
    gang, settings = load_gang(args.gang, args.port)
    low, high = (int(x) for x in args.ranks.split(":"))
    members = Members(gang, settings, range(low, high), Path(args.tokens), args.threads, not args.one_address)
    time.sleep(max(0.0, args.go_at - time.time()))
    members.start()
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        members.command(words)
    emit("summary", **members.summary())
    return 0


def run_coordinator(args) -> int:
    """Rank 0's launcher: its key from the notary, the real Coordinator on loopback, its own member's Link, and,
    once the gang is done, the outcome recorded through the notary (ending.record_through_notary)."""
    from trainhook.launcher.coordination.coordinator import Coordinator
    gang, settings = load_gang(args.gang, args.port)
    notary = NotaryClient(settings.notary_url, settings.notary_ca, token_file=str(Path(args.tokens) / "0.token"))
    key = notary.gang_key(gang.namespace, gang.job_name, 120, log=lambda line: None)
    log = Path(args.log).open("a") if args.log else None

    def say(line: str) -> None:
        if log is not None:
            log.write(line + "\n")
            log.flush()
    coordinator = Coordinator(gang, settings.policy, key, settings.port, log=say)
    coordinator.start()
    emit("listening", port=settings.port, threads=threading.active_count())
    members = Members(gang, settings, range(0, 1), Path(args.tokens), looped=False)  # a Link thread, as in a pod
    members.start()
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        if words[0] == "finish":  # rank 0 exits 0: the gang succeeds, every member is told, then it is recorded
            finished = time.time()
            members.command(words)
            delivered = coordinator.wait_delivered(120)
            acked = time.time()
            outcome = coordinator.state.outcome
            said = (ending.record_through_notary(gang, settings.replace(key=key), outcome, say, notary)
                    if outcome else "no outcome")
            emit("recorded", finished=finished, acked=acked, recorded=time.time(), delivered=delivered,
                 said=said, outcome=outcome.to_dict() if outcome else None)
        else:
            members.command(words)
    emit("summary", **members.summary(), threads=coordinator.threads())
    coordinator.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("role", choices=("members", "coordinator"))
    parser.add_argument("--gang", required=True, help="rank 0's admitted environment, as JSON")
    parser.add_argument("--tokens", required=True, help="a directory of RANK.token files (TokenRequest tokens)")
    parser.add_argument("--port", type=int, required=True, help="the coordinator's port on loopback")
    parser.add_argument("--ranks", default="1:2")
    parser.add_argument("--threads", type=int, default=16, help="members asking the notary at once")
    parser.add_argument("--go-at", type=float, default=0.0, help="wall-clock time at which every member starts")
    parser.add_argument("--log", default="", help="the coordinator's log file")
    parser.add_argument("--one-address", action="store_true", help="every member from 127.0.0.1 (else each its own)")
    args = parser.parse_args(argv)
    return run_members(args) if args.role == "members" else run_coordinator(args)


if __name__ == "__main__":
    raise SystemExit(main())
