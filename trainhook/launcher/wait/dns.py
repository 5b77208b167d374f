"""The gang wait's `dns` mode, and what both modes share (Progress, Result, wait_names): the names a pod waits for.

Why a module of its own: wait.py is the command (which mode, the messages, the exit code), wait_tcp.py the star
barrier; resolving names is the part both modes need, and the part whose cost grows with the gang. A member waits
for its own address and rank 0's; rank 0 asks for the headless Service's name once per poll and resolves each
member's own name only once the Service lists the whole gang, or every FULL_PASS_EVERY seconds (wait.py's
docstring says why, issue 26).
"""

from __future__ import annotations

import queue
import socket
import threading
import time

from trainhook.launcher.pod_view import GangView, Peer
from trainhook.launcher.reach import Backoff, describe, qualified, search_domain
from trainhook.launcher.speak import speaker

TYPE_CHECKING = False  # typing's own, without importing typing (trainhook/launcher/__init__.py says why)
if TYPE_CHECKING:
    from typing import Callable

MEMBER_FLOOR, GATHER_FLOOR = 0.5, 0.25  # the cap's starting value: rank 0's poll is one query, a member's two
FULL_PASS_EVERY = 10.0  # rank 0 resolves every missing member's name at least this often (see wait_gathering)
REPORT_EVERY = 30.0  # seconds between progress lines when nothing changes
CONNECT_TIMEOUT = 5.0

say = speaker("wait", to_stdout=True)


class Progress:
    """Prints a line when what is missing changes, and every REPORT_EVERY seconds otherwise."""

    def __init__(self, what: str, total: int):
        self.what, self.total, self.at = what, total, 0.0
        self.last: tuple | None = None

    def update(self, done: int, missing: list[Peer] | None = None, note: str = "") -> None:
        now = time.monotonic()
        key = (done, tuple(p.rank for p in missing or ()), note)
        if key != self.last or now - self.at >= REPORT_EVERY:
            self.last, self.at = key, now
            line = f"{done}/{self.total} {self.what}" + (f" ({note})" if note else "")
            say(line + (f"; waiting for {describe(missing)}" if missing else ""))


class Result:
    """What a wait found: the members still missing at the deadline (empty: done), why each, and how many are
    missing in all when only some are named (a member's tcp wait knows the first LISTED of rank 0's list).
    A plain class: dataclasses (with inspect, ast, dis and tokenize) was ~10 ms of every init container's start."""

    __slots__ = ("missing", "why", "count", "source")

    def __init__(self, missing: list[Peer] | None = None, why: dict[int, str] | None = None, count: int = 0,
                 source: str = "") -> None:
        self.missing = [] if missing is None else missing
        self.why = {} if why is None else why
        self.count = max(count, len(self.missing))
        self.source = source


def resolves(address: str) -> bool:
    try:
        return bool(socket.getaddrinfo(address, None))
    except (OSError, UnicodeError):
        return False


def addresses_of(name: str) -> set[str]:
    """The distinct addresses `name` resolves to (a headless Service: one per published member); empty if none."""
    try:
        return {str(info[4][0]) for info in socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)}
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


def targets(gang: GangView) -> list[Peer]:
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


def wait_gathering(gang: GangView, deadline: float, resolve: Callable[[str], bool] = resolves,
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


def wait_dns(gang: GangView, timeout: float) -> Result:
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

