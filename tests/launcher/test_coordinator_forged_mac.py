"""One line from anyone with a MAC that is not ASCII must not stop rank 0's coordinator (issue 31).

hmac.compare_digest raises TypeError on a non-ASCII str: after a greeting, the line
`{"seq": 0, "body": {"type": "join"}, "mac": "é"}` escaped the coordinator's loop, and it answered no one after it.
MACs are now compared as bytes (wire.same_mac). The real Coordinator on loopback, as a member reaches it."""

from __future__ import annotations

import json
import socket
import time

from test_gang_protocol import TOKEN, free_port, gang

from trainhook.launcher import wire
from trainhook.launcher.coordination.coordinator import Coordinator
from trainhook.launcher.policy import GangPolicy


def greet(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), 5)
    sock.settimeout(5)
    sock.sendall(json.dumps(wire.member_greeting("ns", "g", 1, wire.new_nonce())).encode() + b"\n")
    assert sock.recv(4096), "the coordinator answers a greeting"
    return sock


def test_a_non_ascii_mac_is_refused_and_the_coordinator_goes_on_answering():
    port, said = free_port(), []
    coordinator = Coordinator(gang(2), GangPolicy(), TOKEN, port, log=said.append)
    coordinator.start()
    try:
        time.sleep(0.3)
        with greet(port) as forger:
            forger.sendall(json.dumps({"seq": 0, "body": {"type": "join"}, "mac": "\u00e9"}).encode() + b"\n")
            time.sleep(0.5)
        with greet(port) as member:  # the next one is still served
            assert member.fileno() >= 0
    finally:
        coordinator.close()
