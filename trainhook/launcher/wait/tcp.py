"""The gang wait's `tcp` mode: a star barrier on its own port, rank 0 gathering (wait.py says why and when); a
module of its own because the barrier (hello, `missing`, `go`, rank 0's one-thread selector, a member's
reconnecting join) is needed only in `tcp` mode.

Who counts as a member, and the lines both ends send: tcp_lines.py; rank 0's gathering: gathering.py; here, the
mode itself (`wait_tcp`) and a member's side of it.
"""

from __future__ import annotations

import os
import socket
import time

from trainhook.launcher import notary_client
from trainhook.launcher.pod_view import GangView
from trainhook.launcher.reach import (Backoff, PeerAddress, connect_peer, describe, listen, retry_floor, search_domain,
                                     why)
from trainhook.launcher.wait.dns import CONNECT_TIMEOUT, MEMBER_FLOOR, Result, say, wait_names
from trainhook.launcher.wait.gathering import Gathering
from trainhook.launcher.wait.tcp_lines import (ADDRESS, KEY, TO_RANK0, barrier_hello, mac, parse_missing,
                                               rank0_nonce, signed_line)
from trainhook.launcher.wire import new_nonce


def gang_wait_key(gang: GangView, deadline: float, env=os.environ) -> bytes:
    """The gang's key when the webhook named a notary in this container (asked until `deadline`), else b"":
    the wait then checks addresses. NotaryError when a notary is named and gives none."""
    notary = notary_client.from_env(env)
    if notary is None:
        return b""
    return notary.gang_key(gang.namespace, gang.job_name, max(1.0, deadline - time.monotonic()), say)


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
                mine = new_nonce()
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
