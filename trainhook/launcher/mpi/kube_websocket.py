"""The websocket (RFC 6455) the launcher's Kubernetes client opens for the exec API, on the standard library alone.

Why a module of its own: framing (pure: the accept key, masking, frames in and out) and the open connection's
whole messages are what the exec API needs beyond plain HTTP, and are tested on their own; kube_api.py is the
client (requests, credentials) that opens one (Client.websocket) and kubexec.py the one user.
"""

from __future__ import annotations

import base64
import hashlib
import os
import ssl
import struct

WEBSOCKET_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455 section 1.3
CONTINUATION, TEXT, BINARY, CLOSE, PING, PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA


# --- websocket framing (pure) ---------------------------------------------------------------------------------

def accept_key(key: str) -> str:
    return base64.b64encode(hashlib.sha1((key + WEBSOCKET_GUID).encode()).digest()).decode()


def masked(data: bytes, mask: bytes) -> bytes:
    """XOR with the 4-byte mask, as one big integer (a byte loop is slow for the megabytes stdin may carry)."""
    if not data:
        return b""
    pad = (mask * (len(data) // 4 + 1))[:len(data)]
    return (int.from_bytes(data, "big") ^ int.from_bytes(pad, "big")).to_bytes(len(data), "big")


def encode_frame(opcode: int, payload: bytes, mask: bytes) -> bytes:
    """One final client frame: clients must mask (RFC 6455 section 5.3)."""
    n = len(payload)
    if n < 126:
        length = bytes([0x80 | n])
    elif n < 65536:
        length = bytes([0x80 | 126]) + struct.pack(">H", n)
    else:
        length = bytes([0x80 | 127]) + struct.pack(">Q", n)
    return bytes([0x80 | opcode]) + length + mask + masked(payload, mask)


def decode_frame(buffer: bytes) -> tuple[bool, int, bytes, int] | None:
    """(final, opcode, payload, bytes used) of the first whole frame in `buffer`, or None until it is whole."""
    if len(buffer) < 2:
        return None
    final, opcode, has_mask, n = bool(buffer[0] & 0x80), buffer[0] & 0x0F, bool(buffer[1] & 0x80), buffer[1] & 0x7F
    start = 2
    if n >= 126:
        size = 2 if n == 126 else 8
        if len(buffer) < 2 + size:
            return None
        n = int.from_bytes(buffer[2:2 + size], "big")
        start += size
    mask = buffer[start:start + 4] if has_mask else b""
    start += len(mask)
    if len(buffer) < start + n or len(mask) < (4 if has_mask else 0):
        return None
    payload = buffer[start:start + n]
    return final, opcode, masked(payload, mask) if has_mask else payload, start + n


class WebSocket:
    """The client end of an open websocket: whole binary messages out (`send`), whole messages in (`receive`
    after the socket is readable; select() on `fileno()`, and check `pending()` first: TLS may hold bytes that
    select cannot see). Pings are answered; a close frame or EOF ends it (`closed`)."""

    def __init__(self, sock: ssl.SSLSocket, protocol: str, buffered: bytes = b""):
        self.sock, self.protocol, self.buffer = sock, protocol, buffered
        self.fragments: list[bytes] = []
        self.closed = False

    def fileno(self) -> int:
        return self.sock.fileno()

    def pending(self) -> bool:
        """Whether `receive` has something without waiting: a whole frame buffered here, or bytes in TLS."""
        return decode_frame(self.buffer) is not None or self.sock.pending() > 0

    def send(self, payload: bytes, opcode: int = BINARY) -> None:
        self.sock.sendall(encode_frame(opcode, payload, os.urandom(4)))

    def receive(self) -> list[bytes]:
        """Read what has arrived (one recv; call when readable) and return the messages it completes."""
        if decode_frame(self.buffer) is None:
            data = self.sock.recv(65536)
            if not data:
                self.closed = True
            self.buffer += data
        messages: list[bytes] = []
        while True:
            frame = decode_frame(self.buffer)
            if frame is None:
                return messages
            final, opcode, payload, used = frame
            self.buffer = self.buffer[used:]
            if opcode == PING:
                self.send(payload, PONG)
            elif opcode == CLOSE:
                self.closed = True
                return messages
            elif opcode in (CONTINUATION, TEXT, BINARY):
                self.fragments.append(payload)
                if final:
                    messages.append(b"".join(self.fragments))
                    self.fragments = []

    def close(self) -> None:
        try:
            if not self.closed:
                self.send(struct.pack(">H", 1000), CLOSE)
        except OSError:
            pass
        self.sock.close()
