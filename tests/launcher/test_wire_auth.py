"""The signed wire (launcher/wire.py) against a peer that sends a MAC no key could have made, in any characters.

hmac.compare_digest raises TypeError for a str with non-ASCII characters, and the wire's readers catch
RejectedMessage: a single line `{"seq": 0, "body": {}, "mac": "é"}` from anyone on the path escaped them (issue 31).
Now it is refused as a forgery, like any other bad MAC, and a signed line on the same channel is still read."""

from __future__ import annotations

import json
import socket

import pytest

from trainhook.launcher import wire

TOKEN = bytes(range(32))


def pair() -> tuple[wire.Channel, wire.Channel]:
    a, b = socket.socketpair()
    member = wire.Channel(a, wire.LineReader(a), TOKEN, "member", "c" * 32, "m" * 32)
    coordinator = wire.Channel(b, wire.LineReader(b), TOKEN, "coordinator", "c" * 32, "m" * 32)
    return member, coordinator


@pytest.mark.parametrize("mac", ["\u00e9", "\u00e9" * 64, "0" * 63 + "\u00e9", "\x00"])
def test_a_mac_in_any_characters_is_refused_as_a_forgery(mac):
    member, coordinator = pair()
    try:
        member.sock.sendall(json.dumps({"seq": 0, "body": {"type": "join"}, "mac": mac}).encode() + b"\n")
        with pytest.raises(wire.RejectedMessage, match="bad signature"):
            coordinator.receive()
    finally:
        member.close()
        coordinator.close()


def test_the_real_signature_still_passes_after_such_a_line_was_refused():
    member, coordinator = pair()
    try:
        member.send({"type": "join"})
        assert coordinator.receive() == {"type": "join"}
        assert wire.same_mac(wire.sign(TOKEN, "m2c", "c", "m", 0, {}), wire.sign(TOKEN, "m2c", "c", "m", 0, {}))
        assert not wire.same_mac("\u00e9", wire.sign(TOKEN, "m2c", "c", "m", 0, {}))
    finally:
        member.close()
        coordinator.close()
