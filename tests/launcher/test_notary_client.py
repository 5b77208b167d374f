"""The launcher's notary client writes its HTTP/1.1 itself (issue 32: http.client's `email` import was ~10 ms of
every launcher's start): what it reads and refuses, and the same answers and errors from the real notary."""

from __future__ import annotations

import socket
import threading
import urllib.parse

import pytest

from gang_notary import GangNotary, indexed_job
from webhook_process import free_port
from trainhook.launcher import notary_client
from trainhook.launcher.notary_client import AnswerError, NotaryClient, NotaryError, read_answer, split_url


@pytest.mark.parametrize("url", [
    "https://trainhook-notary.trainhook.svc:8443", "https://trainhook-notary.trainhook.svc:8443/",
    "https://Notary.Example:443/base/", "https://notary", "https://notary/v1?x=1#y", "HTTPS://notary:8443",
    "https://user:pw@notary:9", "https://[fd00::1]:8443/p", "https://[FD00::1]", "https://10.0.0.7:8443",
    "https://notary:"])
def test_a_url_is_read_as_urlsplit_reads_it(url):
    parsed = urllib.parse.urlsplit(url.strip())
    assert split_url(url) == (parsed.hostname, parsed.port or 443, parsed.path)


@pytest.mark.parametrize("url", ["http://notary:8443", "notary:8443", "https://", "https://:8443",
                                 "https://notary:84x3", "https://notary:99999", "https://[fd00::1:8443",
                                 "https://notary:-1"])
def test_a_url_that_is_no_https_endpoint_is_refused_by_name(url):
    with pytest.raises(NotaryError, match="TRAINHOOK_NOTARY="):
        NotaryClient(url, "-----BEGIN CERTIFICATE-----")


def answer_of(*parts: bytes) -> tuple[int, bytes]:
    """read_answer over a socket pair whose other end sends `parts` (one send each), then closes."""
    ours, theirs = socket.socketpair()
    ours.settimeout(5)

    def send() -> None:
        with theirs:
            for part in parts:
                theirs.sendall(part)

    sender = threading.Thread(target=send)
    sender.start()
    try:
        return read_answer(ours)
    finally:
        sender.join()
        ours.close()


def test_an_answer_is_read_by_its_content_length_in_any_pieces():
    body = b'{"key": "00"}'
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
    assert answer_of(head + body) == (200, body)
    assert answer_of(head[:7], head[7:30], head[30:] + body[:3], body[3:]) == (200, body)
    # nothing past the length is taken: the notary may keep the connection open
    assert answer_of(head + body + b"trailing") == (200, body)


def test_chunks_and_an_answer_up_to_the_close_are_read_whole():
    assert answer_of(b"HTTP/1.1 503 Service Unavailable\r\nTransfer-Encoding: chunked\r\n\r\n",
                     b"5\r\n{\"err\r\n", b"9;ext=1\r\nor\": \"x\"}\r\n0\r\n\r\n") == (503, b'{"error": "x"}')
    assert answer_of(b"HTTP/1.0 403 Forbidden\r\n\r\n", b"no", b" key") == (403, b"no key")
    assert answer_of(b"HTTP/1.1 204 No Content\r\n\r\n") == (204, b"")


def test_a_long_answer_is_cut_at_the_limit_as_before():
    size = notary_client.ANSWER_LIMIT + 1000
    status, body = answer_of(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size, b"x" * size)
    assert (status, len(body)) == (200, notary_client.ANSWER_LIMIT)


@pytest.mark.parametrize("parts, says", [
    ((b"",), "closed before an HTTP answer"),
    ((b"HTTP/1.1 200 OK\r\nContent-Len",), "closed in the answer's head"),
    ((b"SSH-2.0-OpenSSH_9.2\r\n\r\n",), "not an HTTP/1.x status line"),
    ((b"HTTP/1.1 2000 OK\r\n\r\n",), "not an HTTP/1.x status line"),
    ((b"HTTP/2 200\r\n\r\n",), "not an HTTP/1.x status line"),
    ((b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",), "not an HTTP header line"),
    ((b"HTTP/1.1 200 OK\r\n folded: x\r\n\r\n",), "not an HTTP header line"),
    ((b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n",), "Content-Length is '-5'"),
    ((b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",), "5 bytes short"),
    ((b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nxx",), "transfer-encoding 'gzip'"),
    ((b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",), "not a chunk size"),
    ((b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nabc",), "cut short"),
    ((b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n",), "cut short or not followed by CRLF"),
    ((b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n",), "closed in a chunked answer"),
    ((b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * 20000,), "head is over"),
])
def test_what_is_not_such_an_answer_is_refused_by_name(parts, says):
    with pytest.raises(AnswerError, match=says):
        answer_of(*parts)


@pytest.fixture(scope="module")
def notary(tmp_path_factory):
    with GangNotary(tmp_path_factory.mktemp("notary-client")) as notary:
        pods = notary.admit(indexed_job("g", "team-a", completions=2, command=["true"]))
        yield notary, pods


def test_the_real_notary_gives_the_key_and_refuses_a_stranger(notary, tmp_path):
    gang_notary, pods = notary
    name = pods[1]["metadata"]["name"]
    client = notary_client.from_env(gang_notary.env(pods[1]))
    assert client is not None
    assert client.gang_key("team-a", "g", deadline=30) == gang_notary.key(name)
    assert client.recorded_outcome() is None
    forged = tmp_path / "token"
    forged.write_text("not.a.token")
    stranger = NotaryClient(gang_notary.url, gang_notary.ca_pem, str(forged))
    with pytest.raises(NotaryError, match=r"POST /v1/credential: HTTP 401: ") as refused:
        stranger.credential()
    assert refused.value.status == 401
    forged.write_text("a\r\nX-Injected: 1")
    with pytest.raises(NotaryError, match="holds a line break"):
        stranger.credential()


def test_another_ca_or_no_notary_is_said_as_before(notary, tmp_path):
    gang_notary, pods = notary
    token = gang_notary.env(pods[0])["TRAINHOOK_IDENTITY_TOKEN"]
    with GangNotary(tmp_path / "other") as other:
        with pytest.raises(NotaryError, match="failed TLS verification against TRAINHOOK_NOTARY_CA") as failed:
            NotaryClient(gang_notary.url, other.ca_pem, token).credential()
    assert failed.value.status is None
    with pytest.raises(NotaryError, match="is not reachable: connection refused"):
        NotaryClient(f"https://127.0.0.1:{free_port()}", gang_notary.ca_pem, token).credential()


def test_a_listener_that_answers_no_http_is_not_reachable(notary):
    """A TLS-less listener where the notary should be: the handshake fails (TLS), and said so."""
    gang_notary, pods = notary
    token = gang_notary.env(pods[0])["TRAINHOOK_IDENTITY_TOKEN"]
    server = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        connection, _ = server.accept()
        with connection:
            connection.sendall(b"HTTP/1.1 200 OK\r\n\r\n")

    thread = threading.Thread(target=answer)
    thread.start()
    try:
        with pytest.raises(NotaryError, match="failed TLS verification|not reachable"):
            NotaryClient(f"https://127.0.0.1:{server.getsockname()[1]}", gang_notary.ca_pem, token).credential()
    finally:
        thread.join(10)
        server.close()


def test_a_notary_whose_certificate_does_not_name_the_host_is_refused(notary, monkeypatch):
    """The host name goes to ssl as ASCII bytes (notary_client.connection: no idna codec to import), and ssl
    still checks the certificate against it: the notary's names are localhost and 127.0.0.1, not notary.example."""
    gang_notary, pods = notary
    token = gang_notary.env(pods[0])["TRAINHOOK_IDENTITY_TOKEN"]
    loopback = socket.create_connection
    monkeypatch.setattr(socket, "create_connection",
                        lambda address, *args, **kwargs: loopback(("127.0.0.1", address[1]), *args, **kwargs))
    assert NotaryClient(gang_notary.url, gang_notary.ca_pem, token).credential()["key"]  # localhost: its name
    with pytest.raises(NotaryError, match="failed TLS verification against TRAINHOOK_NOTARY_CA") as failed:
        NotaryClient(gang_notary.url.replace("localhost", "notary.example"), gang_notary.ca_pem, token).credential()
    assert "Hostname mismatch" in str(failed.value), failed.value


def test_a_client_given_a_context_uses_it_for_its_calls(notary, tmp_path):
    """A process that plays many pods (bench/gang_scale_members.py) gives its clients one TLS context: they use
    that one, and verify the notary by it, not by the CA they were given."""
    import ssl

    gang_notary, pods = notary
    tokens = [gang_notary.env(p)["TRAINHOOK_IDENTITY_TOKEN"] for p in pods]
    shared = ssl.create_default_context(cadata=gang_notary.ca_pem)
    clients = [NotaryClient(gang_notary.url, gang_notary.ca_pem, token, context=shared) for token in tokens]
    assert all(c.context is shared for c in clients)
    assert len({c.credential()["key"] for c in clients}) == 1
    with GangNotary(tmp_path / "other") as other:
        foreign = ssl.create_default_context(cadata=other.ca_pem)
    with pytest.raises(NotaryError, match="failed TLS verification against TRAINHOOK_NOTARY_CA"):
        NotaryClient(gang_notary.url, gang_notary.ca_pem, tokens[0], context=foreign).credential()
