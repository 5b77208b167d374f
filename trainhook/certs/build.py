"""Build a CA and a serving certificate for the webhook with `cryptography`.

Pure functions: the time is an argument, so validity and rotation decisions are testable without waiting.
Files are named as a Kubernetes TLS Secret names its keys (`ca.crt`, `tls.crt`, `tls.key`), so a directory
written here can be mounted, or turned into a Secret, unchanged.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, ed25519, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_FILE, CERT_FILE, KEY_FILE = "ca.crt", "tls.crt", "tls.key"
# Backdate NotBefore so a node whose clock runs a little behind still accepts a fresh certificate.
CLOCK_SKEW = dt.timedelta(hours=1)
# The private keys that can sign a certificate: build_ca makes EC keys, a CA read back from a Secret may be any.
SIGNING_KEYS = (rsa.RSAPrivateKey, dsa.DSAPrivateKey, ec.EllipticCurvePrivateKey, ed25519.Ed25519PrivateKey,
                ed448.Ed448PrivateKey)


@dataclass(frozen=True)
class KeyPair:
    """A certificate and its private key, both PEM."""

    cert_pem: bytes
    key_pem: bytes


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _san_entry(name: str) -> x509.GeneralName:
    """An IP SAN for an IP literal, a DNS SAN for anything else."""
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def build_ca(common_name: str, now: dt.datetime, days: int = 3650) -> KeyPair:
    """A self-signed CA that signs the serving certificate and goes into the webhook's caBundle."""
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW).not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False, data_encipherment=False,
                                     key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def build_serving_pair(ca: KeyPair, hostnames: list[str], now: dt.datetime, days: int = 365) -> KeyPair:
    """A server certificate for `hostnames` (DNS names or IPs), signed by `ca`."""
    if not hostnames:
        raise ValueError("a serving certificate needs at least one SAN (--san)")
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    if not isinstance(ca_key, SIGNING_KEYS):  # an X25519 or DH key, say: cryptography's sign() would refuse it too
        raise TypeError(f"the CA's key ({type(ca_key).__name__}) cannot sign a certificate")
    issuer_key_id = x509.SubjectKeyIdentifier.from_public_key(ca_cert.public_key())
    key = _new_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hostnames[0][:64])]))
        .issuer_name(ca_cert.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW).not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName([_san_entry(h) for h in hostnames]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(issuer_key_id), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def write_bundle(out: Path, hostnames: list[str], now: dt.datetime | None = None) -> Path:
    """Write ca.crt, tls.crt and tls.key for `hostnames` into `out`; returns `out`."""
    now = now or dt.datetime.now(dt.timezone.utc)
    ca = build_ca("trainhook-ca", now)
    pair = build_serving_pair(ca, hostnames, now)
    out.mkdir(parents=True, exist_ok=True)
    (out / CA_FILE).write_bytes(ca.cert_pem)
    (out / CERT_FILE).write_bytes(pair.cert_pem + ca.cert_pem)
    key_path = out / KEY_FILE
    key_path.touch(mode=0o600)
    key_path.write_bytes(pair.key_pem)
    return out
