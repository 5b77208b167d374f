"""How the notary reads a request's body (webhook/notary/routes.py `read_json`): one that came with its head (a
launcher's always does) is read at once, one that follows its head later is awaited, and either is refused with a
400 naming why when it is not JSON. The real webhook process, a real TLS connection written byte for byte."""

from __future__ import annotations

import json
import socket
import ssl
import time
from urllib.parse import urlsplit

from gang_notary import GangNotary, indexed_job


def post(notary: GangNotary, pod: str, body: bytes, body_after: float | None = None) -> tuple[int, dict]:
    """POST /v1/credential as `pod`, the body with the head or `body_after` seconds after it; (status, answer)."""
    url = urlsplit(notary.url)
    token = notary.token_file(pod).read_text()
    head = (f"POST /v1/credential HTTP/1.1\r\nHost: {url.hostname}\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    context = ssl.create_default_context(cadata=notary.ca_pem)
    with socket.create_connection((url.hostname, url.port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname=url.hostname) as tls:
        if body_after is None:
            tls.sendall(head + body)
        else:
            tls.sendall(head)
            time.sleep(body_after)
            tls.sendall(body)
        answer = b""
        while chunk := tls.recv(65536):
            answer += chunk
    status_line, _, rest = answer.partition(b"\r\n")
    return int(status_line.split()[1]), json.loads(rest.partition(b"\r\n\r\n")[2] or b"{}")


def test_a_body_with_its_head_or_after_it_is_read_and_one_not_json_is_a_400(tmp_path):
    with GangNotary(tmp_path / "run") as notary:
        [pod] = notary.admit(indexed_job("g", "ns"))
        name = pod["metadata"]["name"]
        status, answer = post(notary, name, b"{}")
        assert status == 200 and len(answer["key"]) == 64
        status, late = post(notary, name, b"{}", body_after=0.5)
        assert status == 200 and late["key"] == answer["key"]
        for body, body_after in [(b"not json", None), (b"not json", 0.5), (b"[" * 5000, None)]:
            status, refused = post(notary, name, body, body_after)  # the last: json.loads' RecursionError, a 500
            assert status == 400 and "the body is not JSON" in refused["error"], (body_after, refused)
