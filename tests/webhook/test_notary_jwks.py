"""webhook/notary/jwks.py: a pod-bound token checked against published keys, each claim the API server checks tried
with a token that breaks it (signed by real keys made here, RS256 and ES256 as the API server signs), and the
feature detection: where discovery is not served the caller is told to fall back, and a flood of unknown key ids
re-reads the keys at most once per REFRESH. The same check against the real API server's keys and tokens is
tests/cluster/test_notary_tokens_cluster.py.
"""

from __future__ import annotations

import asyncio
import base64
import json

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

from trainhook.webhook.notary.jwks import DISCOVERY_PATH, JWKS_PATH, REFRESH, Jwks
from trainhook.webhook.notary.membership import identity_from_review

ISSUER = "https://kubernetes.default.svc.cluster.local"
NOW = 1_800_000_000.0
RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
EC_KEY = ec.generate_private_key(ec.SECP256R1())


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def number(n: int, size: int | None = None) -> str:
    return b64(n.to_bytes(size or (n.bit_length() + 7) // 8, "big"))


def jwk(kid: str, key) -> dict:
    numbers = key.public_key().public_numbers()
    if isinstance(key, rsa.RSAPrivateKey):
        return {"kty": "RSA", "kid": kid, "alg": "RS256", "use": "sig", "n": number(numbers.n),
                "e": number(numbers.e)}
    return {"kty": "EC", "kid": kid, "alg": "ES256", "use": "sig", "crv": "P-256", "x": number(numbers.x, 32),
            "y": number(numbers.y, 32)}


def sign(claims: dict, key=RSA_KEY, kid: str = "rsa", alg: str | None = None) -> str:
    alg = alg or ("RS256" if isinstance(key, rsa.RSAPrivateKey) else "ES256")
    data = f"{b64(json.dumps({'alg': alg, 'kid': kid}).encode())}.{b64(json.dumps(claims).encode())}".encode()
    if isinstance(key, rsa.RSAPrivateKey):
        signature = key.sign(data, padding.PKCS1v15(), hashes.SHA256())
    else:
        r, s = decode_dss_signature(key.sign(data, ec.ECDSA(hashes.SHA256())))
        signature = r.to_bytes(32, "big") + s.to_bytes(32, "big")
    return f"{data.decode()}.{b64(signature)}"


def claims(**changes) -> dict:
    """A projected token's claims as the API server writes them for pod `p-0` of `ns` (audience trainhook)."""
    base = {"aud": ["trainhook"], "exp": NOW + 3600, "iat": NOW - 10, "nbf": NOW - 10, "iss": ISSUER,
            "sub": "system:serviceaccount:ns:trainer",
            "kubernetes.io": {"namespace": "ns", "pod": {"name": "p-0", "uid": "pod-uid"},
                              "serviceaccount": {"name": "trainer", "uid": "sa-uid"}}}
    return {**base, **changes}


class Api:
    """What the API server serves at the discovery paths, counting the reads."""

    def __init__(self, keys: list[dict] | None = None, discovery: bool = True):
        self.keys = keys if keys is not None else [jwk("rsa", RSA_KEY), jwk("ec", EC_KEY)]
        self.discovery, self.reads = discovery, []

    async def __call__(self, path: str):
        self.reads.append(path)
        if path == DISCOVERY_PATH:
            return {"issuer": ISSUER, "jwks_uri": ISSUER + JWKS_PATH} if self.discovery else None
        return {"keys": self.keys}


def review(token: str, api: Api | None = None, clock=None) -> dict:
    jwks = Jwks(api or Api(), wall=lambda: NOW, **({"clock": clock} if clock else {}))

    async def run():
        assert await jwks.served()
        return await jwks.review(token)
    return asyncio.run(run())


@pytest.mark.parametrize("key,kid", [(RSA_KEY, "rsa"), (EC_KEY, "ec")], ids=["RS256", "ES256"])
def test_a_token_signed_by_a_published_key_names_its_pod_as_a_tokenreview_would(key, kid):
    identity = identity_from_review(review(sign(claims(), key, kid)))
    assert (identity.namespace, identity.service_account, identity.pod, identity.pod_uid) == \
        ("ns", "trainer", "p-0", "pod-uid")


OTHER_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
BROKEN = {
    "signed by an unpublished key under a published kid": (sign(claims(), OTHER_KEY, "rsa"), "invalid signature"),
    "an RSA-signed token claiming the EC key": (sign(claims(), RSA_KEY, "ec", "RS256"), "invalid signature"),
    "claims changed after signing": (sign(claims()).rsplit(".", 2)[0] + "." + b64(json.dumps(claims(
        sub="system:serviceaccount:ns:admin")).encode()) + "." + sign(claims()).rsplit(".", 1)[1],
        "invalid signature"),
    "unsigned (alg none)": (b64(b'{"alg":"none","kid":"rsa"}') + "." + b64(json.dumps(claims()).encode()) + ".",
                            "unsupported signing algorithm"),
    "HS256 with the public key as secret": (b64(b'{"alg":"HS256","kid":"rsa"}') + "." +
                                            b64(json.dumps(claims()).encode()) + ".c2ln", "unsupported"),
    "expired": (sign(claims(exp=NOW - 1)), "expired"),
    "not valid yet": (sign(claims(nbf=NOW + 600)), "not valid yet"),
    "another audience": (sign(claims(aud=["https://kubernetes.default.svc.cluster.local"])), "audience trainhook"),
    "another issuer": (sign(claims(iss="https://elsewhere.example")), "not by this cluster"),
    "not bound to a pod": (sign({k: v for k, v in claims().items() if k != "kubernetes.io"} | {
        "kubernetes.io": {"namespace": "ns", "serviceaccount": {"name": "trainer", "uid": "sa-uid"}}}),
        "not bound to a pod"),
    "a subject that is not its ServiceAccount": (sign(claims(sub="system:serviceaccount:ns:other")), "subject"),
    "an unknown key id": (sign(claims(), RSA_KEY, "rotated-away"), "no key the API server publishes"),
    "no JWT at all": ("not-a-token", "not a JWT"),
    # json.loads raised RecursionError on it: an HTTP 500 and a logged traceback for anyone who sent one
    "a header nested past the parser's recursion limit": (b64(b"[" * 5000) + "." + b64(b"{}") + ".c2ln", "not a JWT"),
}


@pytest.mark.parametrize("token,reason", BROKEN.values(), ids=BROKEN.keys())
def test_a_token_that_breaks_a_claim_is_refused_naming_it(token, reason):
    answer = review(token)
    assert answer["authenticated"] is False and reason in answer["error"], answer


def test_where_discovery_is_not_served_the_caller_falls_back_and_asks_again_later():
    api, now = Api(discovery=False), [0.0]
    jwks = Jwks(api, wall=lambda: NOW, clock=lambda: now[0])
    assert asyncio.run(jwks.served()) is False
    assert asyncio.run(jwks.served()) is False and api.reads == [DISCOVERY_PATH]  # not asked on every request
    api.discovery, now[0] = True, 301.0  # e.g. the API server upgraded: found at the next detection
    assert asyncio.run(jwks.served()) is True and api.reads == [DISCOVERY_PATH, DISCOVERY_PATH, JWKS_PATH]


def test_a_rotated_key_is_found_and_a_flood_of_unknown_key_ids_reads_the_keys_at_most_once_per_refresh():
    api, now = Api(keys=[jwk("rsa", RSA_KEY)]), [0.0]
    jwks = Jwks(api, wall=lambda: NOW, clock=lambda: now[0])

    async def flood(count: int) -> list[dict]:
        return [await jwks.review(sign(claims(), EC_KEY, f"made-up-{n}")) for n in range(count)]

    assert asyncio.run(jwks.served())
    reads = len(api.reads)
    now[0] = REFRESH  # a while later, 1,000 made-up key ids: one re-read of the keys
    assert all(not a["authenticated"] for a in asyncio.run(flood(1000)))
    assert len(api.reads) == reads + 1
    api.keys.append(jwk("ec", EC_KEY))  # the API server now signs with a new key too
    assert not asyncio.run(jwks.review(sign(claims(), EC_KEY, "ec")))["authenticated"]  # within REFRESH: not re-read
    now[0] = 2 * REFRESH
    assert asyncio.run(jwks.review(sign(claims(), EC_KEY, "ec")))["authenticated"]
    assert len(api.reads) == reads + 2
