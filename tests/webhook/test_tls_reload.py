"""Serving-certificate hot reload, over real TLS against the real server (its console script).

A client that connected before the swap keeps its connection and keeps being answered; a client that connects
after it is served the new chain. Files change the two ways they do in a pod: the kubelet's atomic symlink swap
of a mounted Secret, and one file after the other (a pair that does not match yet is refused, not served).
"""

from __future__ import annotations

import datetime as dt
import http.client
import os
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cryptography import x509

from trainhook.certs.build import KeyPair, build_ca, build_serving_pair
from webhook_process import free_port

HOST = "127.0.0.1"
SANS = [HOST, "localhost"]


def new_pair(name: str) -> tuple[KeyPair, KeyPair]:
    """A CA of its own and a serving pair it issued: (ca, serving)."""
    now = dt.datetime.now(dt.timezone.utc)
    ca = build_ca(f"{name}-ca", now)
    return ca, build_serving_pair(ca, SANS, now)


def serial_of(pair: KeyPair) -> int:
    return x509.load_pem_x509_certificate(pair.cert_pem).serial_number


class KubeletVolume:
    """A Secret volume as the kubelet writes it: `tls.crt -> ..data/tls.crt`, `..data -> ..<timestamp>`, and an
    update is a new timestamped directory and one atomic rename of `..data`."""

    def __init__(self, root: Path):
        self.root, self.version = root, 0
        root.mkdir()

    def write(self, files: dict[str, bytes]) -> None:
        self.version += 1
        target = self.root / f"..{self.version}"
        target.mkdir()
        for name, data in files.items():
            (target / name).write_bytes(data)
        (self.root / "..data_tmp").symlink_to(target.name)
        os.replace(self.root / "..data_tmp", self.root / "..data")
        for name in files:
            if not (self.root / name).is_symlink():
                (self.root / name).symlink_to(f"..data/{name}")


def replace_file(path: Path, data: bytes) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(data)
    os.replace(partial, path)


def files_of(ca: KeyPair, pair: KeyPair) -> dict[str, bytes]:
    return {"tls.crt": pair.cert_pem + ca.cert_pem, "tls.key": pair.key_pem}


class Server:
    def __init__(self, cert: Path, key: Path, workdir: Path):
        self.port = free_port()
        self.log_file = workdir / "webhook.log"
        command = [os.path.join(os.path.dirname(sys.executable), "trainhook-webhook"), "--tls-cert", str(cert),
                   "--tls-key", str(key), "--host", HOST, "--port", str(self.port), "--tls-reload-interval", "0.1"]
        self.process = subprocess.Popen(command, stdout=self.log_file.open("wb"), stderr=subprocess.STDOUT)

    def log(self) -> str:
        return self.log_file.read_text()

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


def client_context(*cas: KeyPair) -> ssl.SSLContext:
    return ssl.create_default_context(cadata="".join(ca.cert_pem.decode() for ca in cas))


def served(server: Server, *trusted: KeyPair) -> int:
    """A new client's view: the serial of the certificate served; the handshake verifies the chain against
    `trusted` only."""
    with socket.create_connection((HOST, server.port), timeout=5) as raw:
        with client_context(*trusted).wrap_socket(raw, server_hostname="localhost") as tls:
            return x509.load_der_x509_certificate(tls.getpeercert(binary_form=True)).serial_number


def wait_until(what: str, check, timeout: float = 15.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
            if value:
                return value
        except (OSError, ssl.SSLError):
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def get(connection: http.client.HTTPSConnection, path: str) -> tuple[int, str]:
    connection.request("GET", path)
    response = connection.getresponse()
    return response.status, response.read().decode()


@pytest.fixture
def first():
    return new_pair("first")


@pytest.mark.parametrize("how", ["kubelet-symlink-swap", "one-file-after-the-other"])
def test_a_new_certificate_is_served_without_dropping_open_connections(tmp_path, first, how):
    (first_ca, first_pair), (second_ca, second_pair) = first, new_pair("second")
    if how == "kubelet-symlink-swap":
        volume = KubeletVolume(tmp_path / "tls")
        volume.write(files_of(first_ca, first_pair))
        cert, key = volume.root / "tls.crt", volume.root / "tls.key"
    else:
        cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
        for path, data in files_of(first_ca, first_pair).items():
            (tmp_path / path).write_bytes(data)
    server = Server(cert, key, tmp_path)
    try:
        wait_until("the server", lambda: served(server, first_ca))
        assert served(server, first_ca) == serial_of(first_pair)

        # A keep-alive client, connected before the swap (it trusts both CAs, as the caBundle does in overlap).
        before = http.client.HTTPSConnection(HOST, server.port, context=client_context(first_ca, second_ca),
                                             timeout=5)
        assert get(before, "/healthz") == (200, "ok")
        sock = before.sock
        assert x509.load_der_x509_certificate(sock.getpeercert(True)).serial_number == serial_of(first_pair)

        if how == "kubelet-symlink-swap":
            volume.write(files_of(second_ca, second_pair))
        else:
            replace_file(cert, second_pair.cert_pem + second_ca.cert_pem)
            # The certificate is new and the key still old: not a pair; the old certificate stays in use.
            wait_until("the mismatched pair to be refused",
                       lambda: "not serving the changed certificate files" in server.log())
            assert served(server, first_ca) == serial_of(first_pair)
            replace_file(key, second_pair.key_pem)

        # A client arriving after the swap gets the new chain, verified against the new CA alone.
        wait_until("the new certificate", lambda: served(server, second_ca) == serial_of(second_pair))
        assert served(server, second_ca) == serial_of(second_pair)
        with pytest.raises(ssl.SSLCertVerificationError):
            served(server, first_ca)

        # The client from before the swap: same connection, same certificate, still answered.
        for path in ("/healthz", "/readyz", "/metrics"):
            assert get(before, path)[0] == 200
        assert before.sock is sock
        assert x509.load_der_x509_certificate(sock.getpeercert(True)).serial_number == serial_of(first_pair)
        before.close()
        assert server.process.poll() is None
        assert "serving a new certificate" in server.log()
    finally:
        server.stop()


def test_files_that_are_not_a_certificate_are_never_served(tmp_path, first):
    first_ca, first_pair = first
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(first_pair.cert_pem + first_ca.cert_pem)
    key.write_bytes(first_pair.key_pem)
    server = Server(cert, key, tmp_path)
    try:
        wait_until("the server", lambda: served(server, first_ca))
        _, stranger = new_pair("stranger")
        for garbage_cert, garbage_key in [(b"not a certificate", first_pair.key_pem),
                                          (first_pair.cert_pem, b"-----BEGIN PRIVATE KEY-----\nAAAA\n"),
                                          (first_pair.cert_pem, stranger.key_pem)]:
            refusals = server.log().count("not serving the changed certificate files")
            replace_file(cert, garbage_cert)
            replace_file(key, garbage_key)
            wait_until("the refusal", lambda: server.log().count("not serving the changed certificate files")
                       > refusals)
            assert served(server, first_ca) == serial_of(first_pair)
        # Then a real pair is picked up again.
        third_ca, third = new_pair("third")
        replace_file(cert, third.cert_pem + third_ca.cert_pem)
        replace_file(key, third.key_pem)
        wait_until("the third certificate", lambda: served(server, third_ca) == serial_of(third))
        assert server.process.poll() is None
    finally:
        server.stop()


def test_a_missing_certificate_at_start_is_a_clear_error(tmp_path):
    done = subprocess.run([os.path.join(os.path.dirname(sys.executable), "trainhook-webhook"),
                           "--tls-cert", str(tmp_path / "absent.crt"), "--tls-key", str(tmp_path / "absent.key")],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert "cannot load --tls-cert/--tls-key" in done.stderr


def test_files_mode_needs_the_files(tmp_path):
    done = subprocess.run([os.path.join(os.path.dirname(sys.executable), "trainhook-webhook")],
                          capture_output=True, text=True, timeout=30, env={
                              k: v for k, v in os.environ.items() if not k.startswith("TRAINHOOK_WEBHOOK_")})
    assert done.returncode == 2
    assert "--tls-cert and --tls-key required" in done.stderr
