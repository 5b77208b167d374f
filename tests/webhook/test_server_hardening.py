"""The server under stress: oversized and trickled bodies, SIGTERM with a review in flight, metrics, logs."""

from __future__ import annotations

import json
import signal
import socket
import ssl
import threading
import time

import requests

from objects import review, statefulset
from webhook_process import start_webhook


def tls_socket(hook) -> ssl.SSLSocket:
    host, port = hook.url.removeprefix("https://").split(":")
    context = ssl.create_default_context(cafile=str(hook.ca_file))
    return context.wrap_socket(socket.create_connection((host, int(port)), timeout=30), server_hostname=host)


def send_headers(conn: ssl.SSLSocket, length: int) -> None:
    conn.sendall(f"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {length}\r\n\r\n".encode())


def read_status(conn: ssl.SSLSocket) -> int:
    data = b""
    while b"\r\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            break
        data += chunk
    return int(data.split(b" ")[1])


def test_an_oversized_body_is_refused_with_413(webhook):
    reply = webhook.post(None, raw=b"{" + b" " * (5 * 1024 * 1024) + b"}")
    assert reply.status_code == 413


def test_a_trickling_client_does_not_starve_the_others(webhook):
    body = json.dumps(review(statefulset("slow", 2))).encode()
    slow = tls_socket(webhook)
    send_headers(slow, len(body))
    slow.sendall(body[:10])  # and then nothing more for a while
    started = time.monotonic()
    for _ in range(20):
        assert webhook.post(review(statefulset("fast", 2))).status_code == 200
    assert time.monotonic() - started < 5
    slow.sendall(body[10:])
    assert read_status(slow) == 200
    slow.close()


def test_sigterm_drains_a_review_in_flight(tmp_path):
    hook = start_webhook(tmp_path)
    try:
        body = json.dumps(review(statefulset("drain", 2))).encode()
        conn = tls_socket(hook)
        send_headers(conn, len(body))
        conn.sendall(body[:20])
        time.sleep(0.3)
        hook.process.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert hook.process.poll() is None, "the server must wait for the review in flight"
        ready = requests.get(hook.url + "/readyz", verify=str(hook.ca_file), timeout=5)
        assert ready.status_code == 503, "a draining server must stop reporting ready"
        conn.sendall(body[20:])
        assert read_status(conn) == 200
        assert hook.process.wait(15) == 0
    finally:
        hook.stop()


def test_metrics_count_admissions_and_refusals_by_reason(tmp_path):
    hook = start_webhook(tmp_path)
    try:
        hook.post(review(statefulset("ok", 2)))
        hook.post(review(statefulset("bad", 2, service="")))
        hook.post(None, raw=b"nope")
        text = requests.get(hook.url + "/metrics", verify=str(hook.ca_file), timeout=5).text
        assert 'trainhook_admissions_total{kind="StatefulSet",outcome="mutated"} 1.0' in text
        assert 'trainhook_admissions_total{kind="StatefulSet",outcome="denied"} 1.0' in text
        assert 'trainhook_refusals_total{reason="spec.serviceName"} 1.0' in text
        assert "trainhook_bad_requests_total 1.0" in text
        assert "trainhook_admission_seconds_bucket" in text
    finally:
        hook.stop()
    lines = [json.loads(line) for line in hook.log_file.read_text().splitlines() if line.startswith("{")]
    denied = [entry for entry in lines if entry["message"] == "denied"]
    assert denied and denied[0]["reasons"] == ["spec.serviceName"] and denied[0]["level"] == "info"


def test_invented_kinds_count_as_other_so_a_client_cannot_grow_the_metrics(tmp_path):
    hook = start_webhook(tmp_path)
    try:
        for n in range(20):
            sent = review(statefulset("x", 2))
            sent["request"]["kind"]["kind"] = f"Invented{n}"
            assert hook.post(sent).json()["response"]["allowed"] is True
        text = requests.get(hook.url + "/metrics", verify=str(hook.ca_file), timeout=5).text
    finally:
        hook.stop()
    assert 'trainhook_admissions_total{kind="other",outcome="unchanged"} 20.0' in text
    assert "Invented" not in text


def test_concurrent_reviews_do_not_share_state(webhook):
    results: dict[int, str] = {}

    def admit(n: int) -> None:
        reply = webhook.post(review(statefulset(f"c{n}", n + 1)))
        results[n] = reply.json()["response"]["patch"]

    threads = [threading.Thread(target=admit, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    import base64
    for n, patch in results.items():
        ops = json.loads(base64.b64decode(patch))
        stamped = [op for op in ops if "replicas" in json.dumps(op.get("value", ""))]
        assert f"worker={n + 1}" in json.dumps(stamped)
