"""Serve the certificate the files hold now: reload them into the live SSLContext when they change.

The files are polled (a hash of both, every few seconds): a mounted Secret changes by the kubelet's symlink
swap, cert-manager rewrites its Secret, the self-managed mode writes its own files; polling sees all three the
same way. A new pair is loaded into the *same* `ssl.SSLContext` the listener uses: handshakes that start
afterwards get the new certificate, connections already open keep theirs, and nothing is dropped.

A pair is checked before the live context sees it (both parse, the key belongs to the certificate, a scratch
context loads it), and the live context then loads those exact bytes, never the files again (which may have
changed in between). A pair that fails the check is logged once and the old one stays in use.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import ssl
import tempfile
from collections.abc import Iterator
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

log = logging.getLogger("trainhook.webhook.tls")
DEFAULT_INTERVAL = 3.0


class BadPair(ValueError):
    """A certificate and key that cannot be served; the message says why."""


def server_context() -> ssl.SSLContext:
    """TLS 1.2 or newer only, as the API server's webhook client and current guidance expect."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


@contextlib.contextmanager
def _pinned(cert_pem: bytes, key_pem: bytes) -> Iterator[tuple[str, str]]:
    """Paths that hold exactly these bytes, for `load_cert_chain` (which only reads paths): memory files on
    Linux (the root filesystem may be read-only), a private temporary directory elsewhere."""
    if hasattr(os, "memfd_create"):
        fds = [os.memfd_create(name, os.MFD_CLOEXEC) for name in ("tls.crt", "tls.key")]
        try:
            for fd, data in zip(fds, (cert_pem, key_pem)):
                os.write(fd, data)
            yield f"/proc/self/fd/{fds[0]}", f"/proc/self/fd/{fds[1]}"
        finally:
            for fd in fds:
                os.close(fd)
        return
    with tempfile.TemporaryDirectory(prefix="trainhook-tls-") as tmp:
        cert_path, key_path = Path(tmp) / "tls.crt", Path(tmp) / "tls.key"
        cert_path.write_bytes(cert_pem)
        key_path.touch(mode=0o600)
        key_path.write_bytes(key_pem)
        yield str(cert_path), str(key_path)


def check_pair(cert_pem: bytes, key_pem: bytes) -> x509.Certificate:
    """The serving certificate (first of the chain) if the pair can be served; BadPair otherwise."""
    try:
        leaf = x509.load_pem_x509_certificates(cert_pem)[0]
    except ValueError as e:
        raise BadPair(f"the certificate is not PEM: {e}") from e
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as e:
        raise BadPair(f"the key is not an unencrypted PEM key: {e}") from e
    if key.public_key() != leaf.public_key():
        raise BadPair("the key does not belong to the certificate")
    with _pinned(cert_pem, key_pem) as (cert_path, key_path):
        try:
            server_context().load_cert_chain(cert_path, key_path)
        except ssl.SSLError as e:
            raise BadPair(f"OpenSSL refuses the pair: {e}") from e
    return leaf


class CertReloader:
    """Keeps `context` serving what `cert_file` and `key_file` hold. `loaded` is the certificate in use."""

    def __init__(self, cert_file: str | Path, key_file: str | Path, context: ssl.SSLContext | None = None):
        self.cert_file, self.key_file = Path(cert_file), Path(key_file)
        self.context = context or server_context()
        self.loaded: x509.Certificate | None = None
        self._loaded_digest: str | None = None
        self._refused_digest: str | None = None

    def _read(self) -> tuple[bytes, bytes, str]:
        cert_pem, key_pem = self.cert_file.read_bytes(), self.key_file.read_bytes()
        return cert_pem, key_pem, hashlib.sha256(cert_pem + b"\0" + key_pem).hexdigest()

    def load(self) -> x509.Certificate:
        """The first load: raises OSError or BadPair, so a server that cannot serve says so at start."""
        cert_pem, key_pem, digest = self._read()
        return self._install(cert_pem, key_pem, digest)

    def check(self) -> bool:
        """Reload if the files changed since the last load; True when a new pair is now served."""
        try:
            cert_pem, key_pem, digest = self._read()
        except OSError as e:
            log.warning("cannot read the serving certificate; keeping the one in use",
                        extra={"cert_file": str(self.cert_file), "error": str(e)})
            return False
        if digest in (self._loaded_digest, self._refused_digest):
            return False
        try:
            leaf = self._install(cert_pem, key_pem, digest)
        except BadPair as e:
            # Often a moment between two writes (certificate new, key still old): the next poll sees both.
            self._refused_digest = digest
            log.warning("not serving the changed certificate files; keeping the one in use",
                        extra={"cert_file": str(self.cert_file), "error": str(e)})
            return False
        log.info("serving a new certificate", extra={"serial": f"{leaf.serial_number:x}",
                                                    "not_after": leaf.not_valid_after_utc.isoformat()})
        return True

    def _install(self, cert_pem: bytes, key_pem: bytes, digest: str) -> x509.Certificate:
        """Serve the pair (BadPair when it cannot be served); returns its certificate, now `loaded`."""
        leaf = check_pair(cert_pem, key_pem)
        with _pinned(cert_pem, key_pem) as (cert_path, key_path):
            # Runs on the event loop's thread, where handshakes run too: none sees a half-loaded context.
            self.context.load_cert_chain(cert_path, key_path)
        self.loaded, self._loaded_digest, self._refused_digest = leaf, digest, None
        return leaf

    async def watch(self, interval: float = DEFAULT_INTERVAL) -> None:
        """Poll forever (cancel to stop)."""
        while True:
            await asyncio.sleep(interval)
            self.check()
