"""The wire between a gang's launchers: JSON lines, every message after the greeting signed with the gang's key.

The key comes from the notary (notary_client.py; docs/operate/security.md): HMAC-SHA256 of the gang's identity
`<namespace>/<job-name>/<anchor workload uid>` under a key only the webhook holds, handed only to a pod whose
projected identity token proves it is a member of this gang. So every member holds it and nobody else does: not
a launcher of another job or namespace, not a pod that merely carries the gang's labels, not someone who can
read the gang's pod specs (the key is in none), and not a job recreated under the same name (a new uid). In the
formulas below `token` is that key.

    member -> coordinator  {"protocol", "namespace", "job", "rank", "nonce": Nm}      greeting, plain
    coordinator -> member  {"protocol", "nonce": Nc}  |  {"error": WHY}               greeting, plain
    then, both ways        {"seq": n, "body": {...}, "mac": HMAC(token, PROTOCOL|direction|Nc|Nm|n|body)}

Both nonces are fresh random values, so each side proves it holds the token on a connection the other just
opened: a recorded message replays nowhere (other nonces), a message is never accepted twice or out of order
(`seq` counts up from 0 per direction), and a coordinator's message can not be reflected back as a member's
(`direction`). A message that fails any check is refused: the connection is closed and the refusal logged.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import threading

PROTOCOL = "trainhook-gang-run/1"
TO_COORDINATOR, TO_MEMBER = "m2c", "c2m"
LINE_LIMIT = 1 << 16
GREETING_TIMEOUT = 10.0


class RejectedMessage(Exception):
    """A message that does not come from this gang (or not from this connection's peer)."""


def new_nonce() -> str:
    return os.urandom(16).hex()  # secrets.token_hex's bytes, without importing secrets (and random)


def canonical(body: dict) -> str:
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


def sign(token: bytes, direction: str, coordinator_nonce: str, member_nonce: str, seq: int, body: dict) -> str:
    text = "|".join((PROTOCOL, direction, coordinator_nonce, member_nonce, str(seq), canonical(body)))
    return hmac.new(token, text.encode(), hashlib.sha256).hexdigest()


def same_mac(given: str, expected: str) -> bool:
    """Constant-time, and safe for any string a peer sends: hmac.compare_digest raises TypeError on a non-ASCII
    str, which would escape a handler that catches RejectedMessage (issue 31)."""
    return hmac.compare_digest(given.encode("utf-8", "replace"), expected.encode())


class LineReader:
    """Reads newline-terminated JSON objects from a socket, keeping what arrives beyond a line."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buffer = b""

    def read(self) -> dict | None:
        """The next object; None when the peer closed the connection. Raises RejectedMessage for garbage."""
        while b"\n" not in self.buffer:
            if len(self.buffer) > LINE_LIMIT:
                raise RejectedMessage("a line longer than 64 KiB")
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        value = json_object(line)
        if value is None:
            raise RejectedMessage(f"not a JSON object: {line[:80]!r}")
        return value


def json_object(line: bytes) -> dict | None:
    """The JSON object one line of a channel carries, or None when the line is not one."""
    try:
        value = json.loads(line)
    except (ValueError, RecursionError):  # "[[[[...": any pod that can open a socket may send it
        return None
    return value if isinstance(value, dict) else None


def send_plain(sock: socket.socket, message: dict) -> None:
    sock.sendall(canonical(message).encode() + b"\n")


class Channel:
    """One side of an authenticated connection (after the greetings): `send` signs, `receive` checks."""

    def __init__(self, sock: socket.socket, reader: LineReader, token: bytes, side: str,
                 coordinator_nonce: str, member_nonce: str):
        self.sock, self.reader, self.token = sock, reader, token
        self.nonces = (coordinator_nonce, member_nonce)
        self.out_direction = TO_MEMBER if side == "coordinator" else TO_COORDINATOR
        self.in_direction = TO_COORDINATOR if side == "coordinator" else TO_MEMBER
        self.sent = 0
        self.received = 0
        self.lock = threading.Lock()
        self.closed = False

    def send(self, body: dict) -> None:
        """Sign and send one message (thread-safe); raises OSError when the connection is gone."""
        with self.lock:
            mac = sign(self.token, self.out_direction, *self.nonces, self.sent, body)
            send_plain(self.sock, {"seq": self.sent, "body": body, "mac": mac})
            self.sent += 1

    def receive(self) -> dict | None:
        """The next message's body, checked; None when the peer closed. Raises RejectedMessage for a forgery."""
        message = self.reader.read()
        if message is None:
            return None
        body, seq, mac = message.get("body"), message.get("seq"), message.get("mac")
        if not isinstance(body, dict) or not isinstance(seq, int) or not isinstance(mac, str):
            raise RejectedMessage("not a signed message")
        if seq != self.received:
            raise RejectedMessage(f"message {seq} out of order (expected {self.received}): a replay")
        expected = sign(self.token, self.in_direction, *self.nonces, seq, body)
        if not same_mac(mac, expected):
            raise RejectedMessage("bad signature: not signed with this gang's key (another gang, or a forgery)")
        self.received += 1
        return body

    def close(self) -> None:
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def member_greeting(namespace: str, job: str, rank: int, nonce: str) -> dict:
    return {"protocol": PROTOCOL, "namespace": namespace, "job": job, "rank": rank, "nonce": nonce}


def check_member_greeting(greeting: dict | None, namespace: str, job: str, size: int) -> tuple[int, str]:
    """(rank, member nonce) of a member's greeting for this gang; RejectedMessage with the reason otherwise. The
    greeting is not signed (the first signed message proves the token); this only gives a stray client a clear
    answer."""
    if greeting is None:
        raise RejectedMessage("closed before greeting")
    if greeting.get("protocol") != PROTOCOL:
        raise RejectedMessage(f"not a trainhook gang launcher (protocol {greeting.get('protocol')!r})")
    if (greeting.get("namespace"), greeting.get("job")) != (namespace, job):
        raise RejectedMessage(f"a launcher of gang {greeting.get('namespace')}/{greeting.get('job')}, "
                              f"not {namespace}/{job}")
    rank, nonce = greeting.get("rank"), greeting.get("nonce")
    if not isinstance(rank, int) or not 0 <= rank < size:
        raise RejectedMessage(f"rank {rank!r} is not in this gang of {size}")
    if not isinstance(nonce, str) or len(nonce) < 16:
        raise RejectedMessage("no nonce")
    return rank, nonce


KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_COUNT = 10, 5, 3


def set_keepalive(sock: socket.socket) -> None:
    """A vanished node (no FIN ever comes) turns into a closed connection in about 25 s."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", KEEPALIVE_IDLE), ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL),
                        ("TCP_KEEPCNT", KEEPALIVE_COUNT)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
