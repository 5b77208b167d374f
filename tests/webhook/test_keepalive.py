"""Kept-alive connections: an idle one is the API server's to close, a head that starts arriving has a deadline.

The API server keeps an idle connection to the webhook for 90 s (Go's http.DefaultTransport, which client-go's
webhook transport keeps) and does not retry a POST. When the webhook closed idle connections after 5 s, a review
now and then went onto a connection the webhook was closing and failed with "failed calling webhook ...: EOF"
(a fresh-clone CI run, test_e2e_elastic). The real webhook process, over TLS, with its deadlines shortened by the
same environment an operator would use.
"""

from __future__ import annotations

import http.client
import json
import ssl
import time

import pytest
from helpers import wait_for
from objects import review, statefulset
from test_webhook_hostile_clients import closed_by_server
from webhook_process import start_webhook

from webhook import connections

API_SERVER_IDLE_TIMEOUT = 90.0  # seconds: Go's http.DefaultTransport.IdleConnTimeout, kept by client-go


def kept_alive(hook) -> http.client.HTTPSConnection:
    host, port = hook.url.removeprefix("https://").split(":")
    context = ssl.create_default_context(cafile=str(hook.ca_file))
    return http.client.HTTPSConnection(host, int(port), context=context, timeout=10)


def post_review(conn: http.client.HTTPSConnection, name: str) -> int:
    conn.request("POST", "/mutate", body=json.dumps(review(statefulset(name, 2))),
                 headers={"Content-Type": "application/json"})
    reply = conn.getresponse()
    reply.read()
    assert reply.getheader("Connection", "").lower() != "close"
    return reply.status


def test_the_default_idle_timeout_outlasts_the_api_servers_so_the_api_server_closes_first():
    assert connections.IDLE_TIMEOUT > API_SERVER_IDLE_TIMEOUT


@pytest.mark.parametrize("first", ["review", "handshake"])
def test_an_idle_connection_outlives_the_head_deadline_and_carries_the_next_review(tmp_path, first):
    """Idle for more than twice the head deadline, after a review or after its handshake only (the API server's
    transport pools a connection it dialled for a burst and did not need), the same socket carries a review."""
    hook = start_webhook(tmp_path, env={"TRAINHOOK_WEBHOOK_HEAD_DEADLINE": "1"})
    conn = kept_alive(hook)
    try:
        if first == "review":
            assert post_review(conn, "first") == 200
        else:
            conn.connect()
        sock = conn.sock
        time.sleep(2.5)
        assert not closed_by_server(sock), f"the webhook closed a connection idle since its {first}"
        sock.settimeout(10)
        assert post_review(conn, "second") == 200
        assert conn.sock is sock  # http.client reconnects silently otherwise
    finally:
        conn.close()
        hook.stop()


def test_a_head_begun_on_a_kept_alive_connection_must_end_within_the_head_deadline(tmp_path):
    """A client that answers one review and then trickles the next head loses its connection at the deadline."""
    hook = start_webhook(tmp_path, env={"TRAINHOOK_WEBHOOK_HEAD_DEADLINE": "1"})
    conn = kept_alive(hook)
    try:
        assert post_review(conn, "first") == 200
        sock = conn.sock
        time.sleep(1.5)  # idle past the head deadline first: the deadline runs from the head's first byte
        sock.sendall(b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: app")
        time.sleep(0.5)
        assert not closed_by_server(sock), "closed before the head deadline from its first byte"
        time.sleep(1.5)
        assert closed_by_server(sock), "a head begun 2 s ago is still open with a 1 s head deadline"
    finally:
        conn.close()
        hook.stop()
    assert "closed: request head not complete within 1 s" in hook.log_file.read_text()


def test_an_idle_connection_is_closed_after_the_idle_timeout(tmp_path):
    """Idle connections are not kept for ever: IDLE_TIMEOUT closes them."""
    hook = start_webhook(tmp_path, env={"TRAINHOOK_WEBHOOK_HEAD_DEADLINE": "1",
                                        "TRAINHOOK_WEBHOOK_IDLE_TIMEOUT": "2"})
    conn = kept_alive(hook)
    try:
        assert post_review(conn, "first") == 200
        sock = conn.sock
        time.sleep(1.0)
        assert not closed_by_server(sock)
        wait_for("the webhook to close a connection idle past its 2 s idle timeout",
                 lambda: closed_by_server(sock), timeout=5, interval=0.1)
    finally:
        conn.close()
        hook.stop()
