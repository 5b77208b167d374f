"""Pod-bound ServiceAccount tokens verified locally, against the keys the API server publishes (issue 31 item 3).

Why: a TokenReview per request let anyone who can reach the notary's port make it call the API server, once per
well-formed token they made up (a flood of unsigned JWTs cost one TokenReview and one pod GET each). The API
server publishes what verifies its tokens: OIDC discovery at `/.well-known/openid-configuration` (the issuer) and
the public keys at `/openid/v1/jwks` (ServiceAccountIssuerDiscovery: beta and on by default from v1.20, GA in
v1.21, served when the API server runs with `--service-account-issuer` and a signing key). With them the notary
checks a token itself: its signature (RS256/384/512 or ES256/384/512, the algorithms the API server signs with)
under a published key, its issuer, audience `trainhook`, expiry and not-before, and the pod-bound claims
(`kubernetes.io`: namespace, serviceaccount, pod name and uid). A forged, unsigned, expired or other-audience
token then costs a signature check and no API call.

What the API server checks that this does not, and who does instead: that the pod the token is bound to still
exists with the token's uid (the notary reads that pod on every request and compares the uid: a deleted pod's
token stops working as soon as the notary sees the deletion); that the ServiceAccount still exists with the token's
uid (not checked: a ServiceAccount deleted and recreated under the same name while its pods run is the one case in
which a locally verified token is accepted where a TokenReview would refuse it, for as long as the pod runs);
revocation by the API server's own cache of invalidated tokens (Kubernetes has none for bound tokens: it relies on
the bound object, as the notary does).

Feature detection: the discovery document is read on the first request and again every REDETECT seconds; where it
is not served (404, or the notary may not read it), `served()` says so and the caller falls back to TokenReview at
a bounded rate (webhook/notary/cluster.py). Unknown key ids (a rotated signing key) make the keys be read again, at
most once per REFRESH seconds, so a flood of made-up key ids costs at most one API call per REFRESH.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from trainhook.gang import keys
from trainhook.webhook.admission.jsontext import parse_body

log = logging.getLogger("trainhook.webhook.notary")

DISCOVERY_PATH = "/.well-known/openid-configuration"
JWKS_PATH = "/openid/v1/jwks"  # the API server serves its keys here, whatever host the document's jwks_uri names
REDETECT = 300.0  # seconds between two reads of the discovery document (and of the keys, when all is known)
RETRY_DETECT = 30.0  # seconds before a failed detection is tried again (TokenReview meanwhile)
REFRESH = 10.0  # seconds: at most one re-read of the keys this often for an unknown key id
NOT_BEFORE_LEEWAY = 60.0  # seconds of clock skew allowed on nbf/iat (the API server's own leeway); none on exp
HASHES: dict[str, type[hashes.SHA256 | hashes.SHA384 | hashes.SHA512]] = {
    "256": hashes.SHA256, "384": hashes.SHA384, "512": hashes.SHA512}
CURVES = {"P-256": (ec.SECP256R1, "ES256"), "P-384": (ec.SECP384R1, "ES384"), "P-521": (ec.SECP521R1, "ES512")}
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"

Fetch = Callable[[str], Awaitable[Any]]  # GET a path of the API server: the decoded JSON, None on 404


def _b64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _int(text: str) -> int:
    return int.from_bytes(_b64(text), "big")


def public_key(jwk: dict) -> tuple[Any, str] | None:
    """A JWK's public key and the algorithm family it verifies ("RS" or the exact ES algorithm), None if unusable."""
    try:
        if jwk.get("kty") == "RSA":
            return rsa.RSAPublicNumbers(_int(jwk["e"]), _int(jwk["n"])).public_key(), "RS"
        if jwk.get("kty") == "EC" and jwk.get("crv") in CURVES:
            curve, alg = CURVES[jwk["crv"]]
            return ec.EllipticCurvePublicNumbers(_int(jwk["x"]), _int(jwk["y"]), curve()).public_key(), alg
    except (KeyError, TypeError, ValueError, binascii.Error):
        return None
    return None


def refused(why: str) -> dict:
    """A TokenReview-shaped refusal (identity_from_review turns it into the 401)."""
    return {"authenticated": False, "error": why}


class Jwks:
    """The API server's issuer and keys, and the local check of a token against them."""

    def __init__(self, fetch: Fetch, wall: Callable[[], float] = time.time,
                 clock: Callable[[], float] = time.monotonic):
        self.fetch, self.wall, self.clock = fetch, wall, clock
        self.issuer: str | None = None
        self.keys: dict[str, tuple[Any, str]] = {}
        self.available: bool | None = None  # None: not detected yet
        self.next_detect = 0.0
        self.last_refresh = float("-inf")
        self._lock: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None
        self.fetches = 0  # API calls made (discovery and keys), for tests and the bench

    @property
    def lock(self) -> asyncio.Lock:
        """One reader at a time, per event loop (a lock belongs to the loop it first waited in)."""
        loop = asyncio.get_running_loop()
        if self._lock is None or self._lock[0] is not loop:
            self._lock = (loop, asyncio.Lock())
        return self._lock[1]

    async def served(self) -> bool:
        """Whether tokens can be verified here (detecting it when due: one caller reads, the others wait)."""
        if self.clock() >= self.next_detect:
            async with self.lock:
                if self.clock() >= self.next_detect:
                    await self._detect()
        return bool(self.available)

    async def _detect(self) -> None:
        try:
            self.fetches += 1
            document = await self.fetch(DISCOVERY_PATH)
            issuer = (document or {}).get("issuer") if isinstance(document, dict) else None
            if not isinstance(issuer, str) or not issuer:
                self._fallback("the API server does not serve service account issuer discovery "
                               f"({DISCOVERY_PATH}: {'not found' if document is None else 'no issuer'})", REDETECT)
                return
            await self._read_keys()
            if not self.keys:
                self._fallback(f"{JWKS_PATH} lists no key the notary can use", RETRY_DETECT)
                return
            if self.available is not True:
                log.info("notary verifies tokens locally", extra={"issuer": issuer, "keys": sorted(self.keys)})
            self.issuer, self.available, self.next_detect = issuer, True, self.clock() + REDETECT
        except Exception as e:  # noqa: BLE001  unreachable, 403 (RBAC), bad JSON: TokenReview until it works
            self._fallback(f"cannot read {DISCOVERY_PATH} or {JWKS_PATH}: {e}", RETRY_DETECT)

    def _fallback(self, why: str, retry: float) -> None:
        if self.available is not False:
            log.warning("notary falls back to TokenReview", extra={"reason": why, "retry_seconds": retry})
        self.available, self.next_detect = False, self.clock() + retry

    async def _read_keys(self) -> None:
        self.last_refresh = self.clock()
        self.fetches += 1
        answer = await self.fetch(JWKS_PATH)
        found = {}
        for jwk in (answer or {}).get("keys") or [] if isinstance(answer, dict) else []:
            key = public_key(jwk) if isinstance(jwk, dict) else None
            if key is not None:
                found[str(jwk.get("kid", ""))] = key
        if found:
            self.keys = found

    async def _key(self, kid: str) -> tuple[Any, str] | None:
        key = self.keys.get(kid)
        if key is None and self.clock() - self.last_refresh >= REFRESH:
            async with self.lock:
                if kid not in self.keys and self.clock() - self.last_refresh >= REFRESH:
                    try:
                        await self._read_keys()
                    except Exception as e:  # noqa: BLE001  the keys known stay; this token is refused
                        log.warning("cannot read the API server's keys", extra={"error": str(e)})
            key = self.keys.get(kid)
        return key

    async def review(self, token: str) -> dict:
        """The TokenReview status the API server would give `token` for audience trainhook (the pod's existence
        apart: see the module docstring), computed here."""
        parts = token.split(".")
        if len(parts) != 3:
            return refused("not a JWT")
        try:
            header, payload = parse_body(_b64(parts[0])), parse_body(_b64(parts[1]))
            signature = _b64(parts[2])
        except (binascii.Error, ValueError, RecursionError):  # anyone may send one, before any signature check
            return refused("not a JWT")
        if not isinstance(header, dict) or not isinstance(payload, dict):
            return refused("not a JWT")
        alg = header.get("alg")
        if not isinstance(alg, str) or alg[:2] not in ("RS", "ES") or alg[2:] not in HASHES:
            return refused(f"unsupported signing algorithm {alg!r}")
        key = await self._key(str(header.get("kid", "")))
        if key is None:
            return refused("signed with no key the API server publishes")
        if not self._signed(key, alg, f"{parts[0]}.{parts[1]}".encode(), signature):
            return refused("invalid signature")
        return self._claims(payload)

    @staticmethod
    def _signed(key: tuple[Any, str], alg: str, data: bytes, signature: bytes) -> bool:
        public, family = key
        digest = HASHES[alg[2:]]()
        try:
            if family == "RS" and alg.startswith("RS"):
                public.verify(signature, data, padding.PKCS1v15(), digest)
                return True
            if family == alg:  # an EC key verifies only its own curve's algorithm; r||s, as JWS encodes it
                half = len(signature) // 2
                if len(signature) % 2 or not half:
                    return False
                der = encode_dss_signature(int.from_bytes(signature[:half], "big"),
                                           int.from_bytes(signature[half:], "big"))
                public.verify(der, data, ec.ECDSA(digest))
                return True
        except (InvalidSignature, ValueError):
            return False
        return False

    def _claims(self, claims: dict) -> dict:
        now = self.wall()
        if claims.get("iss") != self.issuer:
            return refused(f"issued by {claims.get('iss')!r}, not by this cluster's {self.issuer!r}")
        aud = claims.get("aud")
        audiences = [aud] if isinstance(aud, str) else aud if isinstance(aud, list) else []
        if keys.IDENTITY_AUDIENCE not in audiences:
            return refused(f"the token is not for audience {keys.IDENTITY_AUDIENCE}")
        exp, nbf = claims.get("exp"), claims.get("nbf", claims.get("iat", 0))
        if not isinstance(exp, (int, float)) or isinstance(exp, bool) or exp <= now:
            return refused("the token has expired" if isinstance(exp, (int, float)) else "the token has no expiry")
        if not isinstance(nbf, (int, float)) or nbf > now + NOT_BEFORE_LEEWAY:
            return refused("the token is not valid yet")
        kube = claims.get("kubernetes.io")
        kube = kube if isinstance(kube, dict) else {}
        namespace, sa, pod = kube.get("namespace"), kube.get("serviceaccount"), kube.get("pod")
        sa, pod = (sa if isinstance(sa, dict) else {}), (pod if isinstance(pod, dict) else {})
        names = (namespace, sa.get("name"), sa.get("uid"), pod.get("name"), pod.get("uid"))
        if not all(isinstance(n, str) and n for n in names):
            return refused("the token is not bound to a pod")
        username = f"system:serviceaccount:{namespace}:{sa['name']}"
        if claims.get("sub") != username:
            return refused(f"its subject {claims.get('sub')!r} is not {username}")
        return {"authenticated": True, "audiences": [keys.IDENTITY_AUDIENCE],
                "user": {"username": username, "uid": sa["uid"],
                         "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"],
                         "extra": {POD_NAME_EXTRA: [pod["name"]], POD_UID_EXTRA: [pod["uid"]]}}}
