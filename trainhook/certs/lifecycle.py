"""The self-managed certificate lifecycle: pure decisions over the one Secret's data, the time an argument.

The Secret holds four keys:
- `ca.crt`: the trust bundle, every CA the API server must trust, newest first. It is what goes into the
  webhook configuration's caBundle. During a CA rotation it holds the new CA *and* the old one (overlap).
- `ca.key`: the key of the newest CA, the one that signs new serving certificates (the "signer").
- `tls.crt`: the serving certificate, then the CA that issued it; `tls.key`: its key.

`decide(data, hostnames, now)` says what to do with it, in this order:
1. `create`: the CA part is missing or unusable (absent, not PEM, key and certificate disagree, expired):
   a new CA and a new serving pair. The CAs the API server trusts today (`trusted`, read from the caBundle, and
   what is left of the old bundle) stay in the new bundle behind the new CA: a replica that has not synced yet
   still serves a certificate from one of them (the Secret was deleted, say) and must not fail closed.
2. `rotate-ca`: the signer has less than a third of its validity left. A new CA becomes the signer and goes
   first in the bundle; the old CA stays in the bundle, and the serving pair it issued stays in use.
3. `rotate-serving`: the serving pair is missing, unusable, issued by a CA outside the bundle, has less than
   a third of its validity left, or its SANs are not the wanted ones; or it was issued by an older CA and the
   signer has been trusted by the API server (every webhook's caBundle) for at least `Policy.propagation`.
4. `prune`: a CA other than the signer has expired, or is retired: the serving pair is the signer's and has been
   in the Secret for `Policy.retirement`, time for every replica to have synced and to serve it (each syncs about
   once a minute). It leaves the bundle, so a CA whose key was lost (or leaked) is not trusted for years.
5. `keep`.

Two replicas that decide at once decide the same; the Secret's resourceVersion lets only one of them write.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import enum
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes

from trainhook.certs.build import CA_FILE, CERT_FILE, CLOCK_SKEW, KEY_FILE, KeyPair, build_ca, build_serving_pair

CA_KEY_FILE = "ca.key"
SECRET_KEYS = (CA_FILE, CA_KEY_FILE, CERT_FILE, KEY_FILE)


@dataclass(frozen=True)
class Policy:
    """Lifetimes and when to renew. The defaults follow what cert-manager and cert-controller users expect:
    a long-lived CA, a yearly serving certificate, renewal with a third of the lifetime left."""

    ca_common_name: str = "trainhook-ca"
    ca_lifetime: dt.timedelta = dt.timedelta(days=3650)
    serving_lifetime: dt.timedelta = dt.timedelta(days=365)
    # Renew when less than this fraction of a certificate's validity remains.
    renew_fraction: float = 1 / 3
    # How long a new CA must have been trusted by the API server before serving certificates switch to it:
    # time for every API server instance to pick up the new caBundle.
    propagation: dt.timedelta = dt.timedelta(minutes=5)
    # How long the signer's serving pair must have been in the Secret before the other CAs (which issued what
    # replicas served before) leave the bundle: several sync intervals, so every replica serves the new pair.
    retirement: dt.timedelta = dt.timedelta(minutes=5)

    def __post_init__(self) -> None:
        if not 0 < self.renew_fraction < 1:
            raise ValueError(f"renew_fraction must be between 0 and 1, got {self.renew_fraction}")
        if self.ca_lifetime * self.renew_fraction <= self.serving_lifetime:
            # The CA renews with ca_lifetime * renew_fraction left; a serving certificate issued just before
            # that must not outlive its CA.
            raise ValueError("the CA's renewal window must be longer than the serving certificate's lifetime")


class Action(str, enum.Enum):
    KEEP = "keep"
    CREATE = "create"
    ROTATE_CA = "rotate-ca"
    ROTATE_SERVING = "rotate-serving"
    PRUNE = "prune"


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    # The Secret data to hold afterwards (the input unchanged for `keep`).
    data: Mapping[str, bytes]

    @property
    def changed(self) -> bool:
        return self.action is not Action.KEEP


class Unusable(ValueError):
    """Secret data that cannot be used; the message says why."""


# --- parsing ------------------------------------------------------------------------------------------------

def pem_certificates(pem: bytes) -> list[x509.Certificate]:
    """Every certificate in a PEM bundle; Unusable when there is none or one is malformed."""
    if b"-----BEGIN CERTIFICATE-----" not in pem:
        raise Unusable("no PEM certificate")
    try:
        return x509.load_pem_x509_certificates(pem)
    except ValueError as e:
        raise Unusable(f"a malformed certificate: {e}") from e


def _private_key(pem: bytes) -> PrivateKeyTypes:
    try:
        return serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as e:
        raise Unusable(f"a malformed private key: {e}") from e


def _same_key(cert: x509.Certificate, key: PrivateKeyTypes) -> bool:
    return cert.public_key() == key.public_key()


def fingerprint(cert: x509.Certificate) -> str:
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


def issued_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    """`ca` signed `cert` (signature and issuer name checked, not validity)."""
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def issued_by_any(cert: x509.Certificate, cas: Iterable[x509.Certificate]) -> bool:
    return any(issued_by(cert, ca) for ca in cas)


def sans(cert: x509.Certificate) -> frozenset[str]:
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return frozenset()
    return frozenset([*names.get_values_for_type(x509.DNSName),
                      *(str(ip) for ip in names.get_values_for_type(x509.IPAddress))])


def remaining_fraction(cert: x509.Certificate, now: dt.datetime) -> float:
    """The part of the certificate's validity still ahead (0 when expired). NotBefore's backdating counts as
    validity, which makes no practical difference and keeps this a property of the certificate alone."""
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    return max(0.0, (end - now) / (end - start))


@dataclass(frozen=True)
class Authority:
    """The CA part of the Secret: the trust bundle (newest first) and the signer, the CA whose key we hold."""

    bundle: tuple[x509.Certificate, ...]
    signer: x509.Certificate
    signer_key_pem: bytes


def parse_authority(data: Mapping[str, bytes], now: dt.datetime) -> Authority:
    for name in (CA_FILE, CA_KEY_FILE):
        if not data.get(name):
            raise Unusable(f"{name} is missing")
    bundle = pem_certificates(data[CA_FILE])
    key = _private_key(data[CA_KEY_FILE])
    signers = [ca for ca in bundle if _same_key(ca, key)]
    if not signers:
        raise Unusable(f"{CA_KEY_FILE} belongs to no certificate in {CA_FILE}")
    signer = signers[0]
    if signer.not_valid_after_utc <= now:
        raise Unusable(f"the CA expired at {signer.not_valid_after_utc:%Y-%m-%d %H:%M}Z")
    return Authority(tuple(bundle), signer, data[CA_KEY_FILE])


def parse_serving(data: Mapping[str, bytes], authority: Authority, now: dt.datetime) -> x509.Certificate:
    """The serving certificate (the first in tls.crt), checked against tls.key and the trust bundle."""
    for name in (CERT_FILE, KEY_FILE):
        if not data.get(name):
            raise Unusable(f"{name} is missing")
    leaf = pem_certificates(data[CERT_FILE])[0]
    if not _same_key(leaf, _private_key(data[KEY_FILE])):
        raise Unusable(f"{KEY_FILE} does not belong to {CERT_FILE}")
    if not issued_by_any(leaf, _unexpired(authority.bundle, now)):
        raise Unusable(f"{CERT_FILE} was issued by no unexpired CA in {CA_FILE}")
    if leaf.not_valid_after_utc <= now:
        raise Unusable(f"{CERT_FILE} expired at {leaf.not_valid_after_utc:%Y-%m-%d %H:%M}Z")
    return leaf


# --- building -----------------------------------------------------------------------------------------------

def _pem(certs: Iterable[x509.Certificate]) -> bytes:
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs)


def _serving_data(bundle: Sequence[x509.Certificate], signer: KeyPair, hostnames: Sequence[str],
                  now: dt.datetime, policy: Policy) -> dict[str, bytes]:
    pair = build_serving_pair(signer, list(hostnames), now, days=policy.serving_lifetime.days)
    return {CA_FILE: _pem(bundle), CA_KEY_FILE: signer.key_pem,
            CERT_FILE: pair.cert_pem + signer.cert_pem, KEY_FILE: pair.key_pem}


def fresh_data(hostnames: Sequence[str], now: dt.datetime, policy: Policy = Policy()) -> dict[str, bytes]:
    """A new CA and a serving pair it issued, as Secret data."""
    ca = build_ca(policy.ca_common_name, now, days=policy.ca_lifetime.days)
    return _serving_data(pem_certificates(ca.cert_pem), ca, hostnames, now, policy)


# --- deciding -----------------------------------------------------------------------------------------------

def decide(data: Mapping[str, bytes] | None, hostnames: Sequence[str], now: dt.datetime,
           policy: Policy = Policy(), trusted: Iterable[x509.Certificate] | None = None) -> Decision:
    """What to do with the Secret's data at `now`. `trusted`: the CAs every webhook of the configuration
    trusts today (None when unknown); it only gates moving the serving pair to a newly rotated CA."""
    if not hostnames:
        raise ValueError("a serving certificate needs at least one hostname")
    data = dict(data or {})
    try:
        authority = parse_authority(data, now)
    except Unusable as e:
        return _create(f"the CA is unusable: {e}" if data else "no certificates yet", data, hostnames, now,
                       policy, trusted)
    signer = KeyPair(authority.signer.public_bytes(serialization.Encoding.PEM), authority.signer_key_pem)

    if remaining_fraction(authority.signer, now) < policy.renew_fraction:
        new_ca = build_ca(policy.ca_common_name, now, days=policy.ca_lifetime.days)
        bundle = [*pem_certificates(new_ca.cert_pem), *_unexpired(authority.bundle, now)]
        return Decision(Action.ROTATE_CA, f"the CA expires at {authority.signer.not_valid_after_utc:%Y-%m-%d}; "
                        "a new CA joins the bundle, the old one stays until it expires",
                        {**data, CA_FILE: _pem(bundle), CA_KEY_FILE: new_ca.key_pem})

    try:
        leaf = parse_serving(data, authority, now)
    except Unusable as e:
        return _rotate_serving(f"the serving pair is unusable: {e}", authority, signer, hostnames, now, policy)
    if remaining_fraction(leaf, now) < policy.renew_fraction:
        return _rotate_serving(f"the serving certificate expires at {leaf.not_valid_after_utc:%Y-%m-%d %H:%M}Z",
                               authority, signer, hostnames, now, policy)
    if sans(leaf) != frozenset(hostnames):
        return _rotate_serving(f"the serving certificate names {sorted(sans(leaf))}, wanted {sorted(hostnames)}",
                               authority, signer, hostnames, now, policy)
    if not issued_by(leaf, authority.signer) and _propagated(authority.signer, trusted, now, policy):
        return _rotate_serving("the serving certificate moves to the new CA, which the API server now trusts",
                               authority, signer, hostnames, now, policy)

    others = [ca for ca in authority.bundle if ca is not authority.signer]
    expired = [ca for ca in others if ca.not_valid_after_utc <= now]
    retired = [] if not issued_by(leaf, authority.signer) or _age(leaf, now) < policy.retirement else others
    gone = [ca for ca in others if ca in expired or ca in retired]
    if gone:
        kept = [ca for ca in authority.bundle if ca not in gone]
        why = (f"{len(retired)} CA(s) retired: every replica serves the signer's pair by now" if retired
               else f"{len(expired)} expired CA(s) leave the bundle")
        return Decision(Action.PRUNE, why, {**data, CA_FILE: _pem(kept)})
    return Decision(Action.KEEP, "valid", data)


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        return False


def _age(cert: x509.Certificate, now: dt.datetime) -> dt.timedelta:
    """How long ago we issued `cert` (its NotBefore is backdated by CLOCK_SKEW)."""
    return now - (cert.not_valid_before_utc + CLOCK_SKEW)


def _create(reason: str, data: Mapping[str, bytes], hostnames: Sequence[str], now: dt.datetime, policy: Policy,
            trusted: Iterable[x509.Certificate] | None) -> Decision:
    """A new CA and serving pair; the CAs trusted today stay behind the new one (until retired), so the replicas
    still serving a certificate they issued keep being trusted while they catch up."""
    fresh = fresh_data(hostnames, now, policy)
    try:
        left = pem_certificates(data.get(CA_FILE) or b"")
    except Unusable:
        left = []
    carried, seen = [], {fingerprint(c) for c in pem_certificates(fresh[CA_FILE])}
    for ca in _unexpired([*(trusted or []), *left], now):
        if fingerprint(ca) not in seen and _is_ca(ca):
            seen.add(fingerprint(ca))
            carried.append(ca)
    if carried:
        reason += f"; the {len(carried)} CA(s) trusted until now stay in the bundle until every replica moved"
    return Decision(Action.CREATE, reason, {**fresh, CA_FILE: fresh[CA_FILE] + _pem(carried)})


def _unexpired(cas: Iterable[x509.Certificate], now: dt.datetime) -> list[x509.Certificate]:
    return [ca for ca in cas if ca.not_valid_after_utc > now]


def _rotate_serving(reason: str, authority: Authority, signer: KeyPair, hostnames: Sequence[str],
                    now: dt.datetime, policy: Policy) -> Decision:
    return Decision(Action.ROTATE_SERVING, reason,
                    _serving_data(_unexpired(authority.bundle, now), signer, hostnames, now, policy))


def _propagated(ca: x509.Certificate, trusted: Iterable[x509.Certificate] | None, now: dt.datetime,
                policy: Policy) -> bool:
    if trusted is None or fingerprint(ca) not in {fingerprint(t) for t in trusted}:
        return False
    created = ca.not_valid_before_utc + CLOCK_SKEW
    return now - created >= policy.propagation


# --- the caBundle -------------------------------------------------------------------------------------------

def decode_ca_bundle(ca_bundle: str | bytes | None) -> list[x509.Certificate]:
    """The certificates in a webhook's caBundle as the API returns it (base64 of PEM); [] when empty or
    unreadable (an unreadable caBundle trusts nothing of ours and gets overwritten)."""
    if not ca_bundle:
        return []
    raw = ca_bundle.encode() if isinstance(ca_bundle, str) else ca_bundle
    if b"-----BEGIN" not in raw:
        try:
            raw = base64.b64decode(raw, validate=False)
        except (binascii.Error, ValueError):
            return []
    try:
        return pem_certificates(raw)
    except Unusable:
        return []


def encode_ca_bundle(ca_pem: bytes) -> str:
    return base64.b64encode(ca_pem).decode()


def bundle_in_place(ca_bundles: Sequence[str | bytes | None], ca_pem: bytes) -> bool:
    """Every webhook's caBundle holds exactly our trust bundle (order aside); an empty list is not in place."""
    wanted = {fingerprint(c) for c in pem_certificates(ca_pem)}
    return bool(ca_bundles) and all({fingerprint(c) for c in decode_ca_bundle(b)} == wanted for b in ca_bundles)


def trusted_everywhere(ca_bundles: Sequence[str | bytes | None]) -> list[x509.Certificate]:
    """The CAs that every webhook's caBundle holds (what the API server trusts for all of them)."""
    if not ca_bundles:
        return []
    per_webhook = [decode_ca_bundle(b) for b in ca_bundles]
    common = set.intersection(*({fingerprint(c) for c in certs} for certs in per_webhook))
    return [c for c in per_webhook[0] if fingerprint(c) in common]

