"""Reaching a gang peer by name at a cost the cluster DNS can bear (issue 26): one helper for the gang wait
(wait.py) and the launcher's connection to the coordinator (gang_link.Link).

Why a helper: on a real node a 32-pod gang asked rank 0's name 3,342 times. Three habits did it, each harmless in a
small gang: relative names (a name not published yet costs A and AAAA for each search domain and the bare name,
8 to 10 queries, where an absolute one costs 2), a lookup before every connect attempt (a member retried every 0.1
to 0.5 s until rank 0's launcher listened, re-resolving an address it already had), and a retry cap that never
rose. Here:

- `qualified` makes a peer's name absolute with the pod's own search domain (from resolv.conf);
- `PeerAddress` resolves it once and keeps the address: a connect that is refused (the peer's process is not
  listening yet) reuses it; one that times out or finds no route (the pod may be gone, and with it its address),
  a connection that was up and was lost, or an address older than REUSE_FOR is resolved again;
- `Backoff` spaces the retries: jittered, so a gang's pods, which start together, do not ask in step, with a cap
  that starts at a floor (the gang usually forms within seconds) and rises with the time already waited, so a
  gang that waits minutes for a missing peer asks every few seconds, not every half second. A retry that costs
  no query (the address is known, the peer refused: it is about to listen) starts from a lower floor
  (`retry_floor`): rank 0's launcher is often the last to listen, and each member's next try after that is
  on the gang's critical path.

Standard library only: this runs in the user's container.
"""

from __future__ import annotations

import os
import socket
import time

TYPE_CHECKING = False  # typing's own, without importing typing (trainhook/launcher/__init__.py says why)
if TYPE_CHECKING:
    from typing import Callable, Iterable

FIRST_DELAY, GROWTH, MAX_DELAY = 0.1, 1.5, 5.0
CAP_SHARE = 0.05  # the cap rises to this share of the time waited: a late answer costs at most ~5% more waiting
REFUSED_FLOOR = 0.1  # the cap's starting value while a known address refuses (see retry_floor)
REUSE_FOR = 10.0  # seconds a resolved address is reused while connects to it are refused
LISTED = 8  # members named in one message; the rest are counted


def draw() -> float:
    """A uniform float in [0, 1), from os.urandom: the launcher's jitter without importing `random` (which, with
    `secrets`, was ~0.6 ms of every start's CPU: issue 32)."""
    return int.from_bytes(os.urandom(7), "big") / (1 << 56)


def uniform(low: float, high: float) -> float:
    """A uniform float between `low` and `high`, as random.uniform."""
    return low + (high - low) * draw()


class Backoff:
    """Delays between polls: growing by GROWTH from FIRST_DELAY to a cap, each drawn in [delay/2, delay].

    The cap is `floor` at first and then CAP_SHARE of the time already waited, up to MAX_DELAY: answers that come
    in the first seconds are seen within `floor`, and a wait of minutes polls every few seconds. The jitter keeps
    the pods of a gang, which start together, from asking in step."""

    def __init__(self, floor: float, clock: Callable[[], float] = time.monotonic,
                 draw: Callable[[], float] = draw):
        self.floor, self.clock, self.draw = floor, clock, draw
        self.started, self.delay = clock(), FIRST_DELAY / GROWTH

    def cap(self, floor: float | None = None) -> float:
        return min(MAX_DELAY, max(self.floor if floor is None else floor, (self.clock() - self.started) * CAP_SHARE))

    def next(self, floor: float | None = None) -> float:
        """The next delay; `floor` overrides the starting cap for this one (a cheaper retry may come sooner)."""
        self.delay = min(self.cap(floor), self.delay * GROWTH)
        return self.delay * (0.5 + 0.5 * self.draw())


def retry_floor(error: BaseException, floor: float) -> float:
    """The cap's starting value after `error`: REFUSED_FLOOR when the peer's address is known and its host refused
    (its process is about to listen: asking again costs a SYN and a RST, no DNS query, and every tenth of a second
    a member waits past that is a tenth of a second of the gang's start), `floor` otherwise (a lookup, 2 queries)."""
    return min(floor, REFUSED_FLOOR) if isinstance(error, ConnectionRefusedError) else floor


def search_domain(namespace: str, resolv_conf: str = "/etc/resolv.conf") -> str | None:
    """The pod's `<namespace>.svc.<cluster domain>`: the first search domain the kubelet writes into a pod's
    resolv.conf (dnsPolicy ClusterFirst); None when it is not there (another dnsPolicy, trainhook local)."""
    try:
        with open(resolv_conf) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        words = line.split()
        if words[:1] == ["search"] and len(words) > 1 and words[1].startswith(f"{namespace}.svc."):
            return words[1].rstrip(".")
    return None


def qualified(address: str, domain: str | None) -> str:
    """`address` made absolute (`host-0.sub.ns.svc.cluster.local.`) when the pod's search domain is known: a name
    not published yet then costs 2 queries (A, AAAA), not 2 for each search domain and the bare name (8 to 10).
    An IP address stays as it is."""
    if not domain or address.endswith(".") or is_ip(address):
        return address
    return f"{address}.{domain}."


def is_ip(address: str) -> bool:
    """Whether `address` is an IPv4 or IPv6 address (a zone after % allowed), as ipaddress.ip_address says, without
    importing ipaddress at every launcher's start."""
    for family, text in ((socket.AF_INET, address), (socket.AF_INET6, address.partition("%")[0])):
        try:
            socket.inet_pton(family, text)
        except (OSError, ValueError):
            continue
        return True
    return False


def ascii_name(name: str) -> str | bytes:
    """`name` as getaddrinfo (socket.create_connection) and ssl's server_hostname take it without the idna codec:
    its ASCII bytes. Given a str, both run it through that codec, which for an ASCII name gives the same bytes, and
    importing it (encodings.idna, stringprep, unicodedata) was ~1.5 ms of every launcher's start (issue 32). Pod,
    Service and peer names and addresses are ASCII; anything else stays a str, for the codec."""
    return name.encode("ascii") if name.isascii() else name


def dial(host: str, port: int, timeout: float, source_address: tuple[str, int] | None = None) -> socket.socket:
    """socket.create_connection to `host` as ascii_name gives it: typeshed says a str, but the lookup it makes,
    getaddrinfo, takes bytes as well (in every Python 3)."""
    return socket.create_connection((ascii_name(host), port), timeout=timeout,  # type: ignore[arg-type]
                                    source_address=source_address)


def first_address(name: str) -> str:
    """The first address `name` resolves to for a TCP connection (IPv4 or IPv6); socket.gaierror if none."""
    return str(socket.getaddrinfo(ascii_name(name), None, type=socket.SOCK_STREAM)[0][4][0])


def stale(error: BaseException) -> bool:
    """Whether a failed connect says the address itself may be wrong: anything but a refusal (a refusal comes
    from a live host whose process does not listen yet) and a failed lookup (there was no address to blame)."""
    return isinstance(error, OSError) and not isinstance(error, (ConnectionRefusedError, socket.gaierror))


class PeerAddress:
    """A peer's name, resolved as an absolute name and kept (see the module docstring for when it is asked again).

    `get` returns the address to dial (socket.gaierror when the name does not resolve yet), `failed` is told how a
    connect to it went wrong, `lost` that a connection to it was up and went away."""

    def __init__(self, name: str, domain: str | None = None, reuse_for: float = REUSE_FOR,
                 lookup: Callable[[str], str] = first_address, clock: Callable[[], float] = time.monotonic):
        self.name = qualified(name, domain)
        self.reuse_for, self.lookup, self.clock = reuse_for, lookup, clock
        self.address: str | None = None
        self.resolved_at = 0.0
        self.lookups = 0  # how many times the name was asked: what the tests count

    def get(self) -> str:
        if self.address is None or self.clock() - self.resolved_at >= self.reuse_for:
            self.lookups += 1
            try:
                self.address = self.lookup(self.name)
            except (OSError, UnicodeError):
                self.address = None
                raise
            self.resolved_at = self.clock()
        return self.address

    def failed(self, error: BaseException) -> None:
        if stale(error):
            self.address = None

    def lost(self) -> None:
        self.address = None

    def __str__(self) -> str:
        return self.name if self.address is None else f"{self.name} ({self.address})"


def connect_peer(peer: PeerAddress, port: int, timeout: float) -> socket.socket:
    """A TCP connection to the peer's address (resolved or reused); the error raised is the connect's or the
    lookup's, and the peer is told about it."""
    try:
        return dial(peer.get(), port, timeout)
    except OSError as e:
        peer.failed(e)
        raise


# Shared by the gang wait (wait.py), the coordinator and the MPI launcher; here, not in wait.py, so that rank 0's
# coordinator does not import the whole gang wait to name peers and listen (issue 26: every module a start imports
# costs it CPU).
def why(error: OSError) -> str:
    """Why a connection to a peer failed, in a few words for a log line (the gang wait and the MPI launcher)."""
    if isinstance(error, socket.gaierror):
        return "its address does not resolve"
    if isinstance(error, ConnectionRefusedError):
        return "connection refused"
    if isinstance(error, (socket.timeout, TimeoutError)):
        return "connection timed out"
    return error.strerror or type(error).__name__


def describe(peers: Iterable[object], limit: int = LISTED) -> str:
    """A readable list of peers, cut at `limit` so a 512-pod gang does not print a page per line."""
    items = [str(p) for p in peers]
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def listen(port: int) -> socket.socket:
    """Listen on every interface, IPv6 and IPv4 where the pod has both, IPv4 alone otherwise."""
    if socket.has_dualstack_ipv6():
        try:
            return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True, backlog=1024)
        except OSError:
            pass  # IPv6 disabled in this pod's network: fall back to IPv4
    return socket.create_server(("", port), backlog=1024)
