"""The notary's token check against the real v1.20 API server (issue 31 item 3): a real projected token (TokenRequest
bound to a pod, audience trainhook) is verified against the keys the API server publishes at /openid/v1/jwks, with
no TokenReview; forged, unsigned, other-audience and deleted-pod tokens are refused; 10,000 forged tokens make no
API call at all (counted at the API server: apiserver_request_total from its /metrics); and where tokens are
reviewed instead (`--notary-tokens review`, what a cluster without issuer discovery gets) a real token still works
and a flood of forged ones costs the API server a bounded rate of TokenReviews.

Before: every well-formed JWT cost a TokenReview and a pod GET, whoever sent it.
"""

from __future__ import annotations

import base64
import concurrent.futures
import json
import time
import uuid

import pytest
import requests
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from kubernetes import client

from cluster_api import start_notary
from helpers import wait_for
from test_notary_cluster import call, create_gang, expected_key, pod_token

FLOOD = 10_000


def api_requests(api, resource: str, verb: str) -> int:
    """How many `verb` requests for `resource` the API server has answered (every code), from its /metrics."""
    method, url, headers, _, _ = api.param_serialize("GET", "/metrics", auth_settings=["BearerToken"])
    text = api.call_api(method, url, header_params=headers).read().decode()
    total = 0
    for line in text.splitlines():
        if (line.startswith("apiserver_request_total{") and f'resource="{resource}"' in line
                and f'verb="{verb}"' in line and 'subresource=""' in line):
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


def quiet(api) -> None:
    """Wait until no namespace is being deleted: the namespace controller lists every kind (pods too) in one while it
    empties it, which would count here as pod LISTs nobody in the test made."""
    core = client.CoreV1Api(api)
    wait_for("no namespace terminating", lambda: all(ns.status.phase != "Terminating"
                                                     for ns in core.list_namespace().items), timeout=60)


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def parts(token: str) -> tuple[dict, dict]:
    header, payload, _ = token.split(".")
    pad = lambda text: text + "=" * (-len(text) % 4)  # noqa: E731
    return json.loads(base64.urlsafe_b64decode(pad(header))), json.loads(base64.urlsafe_b64decode(pad(payload)))


OWN_KEY = ec.generate_private_key(ec.SECP256R1())  # a key the API server never published


def forged(header: dict, payload: dict, signed: bool = True) -> str:
    """A token with these claims: signed ES256 by a key of ours (the real key id kept), or unsigned (alg none)."""
    if not signed:
        header = {**header, "alg": "none"}
    data = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(payload).encode())}"
    if not signed:
        return data + "."
    r, s = decode_dss_signature(OWN_KEY.sign(data.encode(), ec.ECDSA(hashes.SHA256())))
    return f"{data}.{b64(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"


def test_a_real_token_is_verified_here_and_forged_ones_are_refused_without_a_tokenreview(notary, control_plane,
                                                                                        k8s_namespace):
    api = control_plane.api_client()
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    sts = create_gang(api, k8s_namespace, "signed", replicas=2)
    reviews = api_requests(api, "tokenreviews", "POST")
    real = pod_token(api, k8s_namespace, "signed-1")
    answer = call(notary, "POST", "/v1/credential", real, {})
    assert answer.status_code == 200, answer.text
    assert answer.json()["key"] == expected_key(k8s_namespace, "signed", sts["metadata"]["uid"])[1]

    header, payload = parts(real)
    rank0 = {**payload, "kubernetes.io": {**payload["kubernetes.io"], "pod": {
        "name": "signed-0", "uid": core.read_namespaced_pod("signed-0", k8s_namespace).metadata.uid}}}
    head, body, signature = real.split(".")
    refusals = {
        "a real signature over other claims": (f"{head}.{b64(json.dumps(rank0).encode())}.{signature}",
                                               "invalid signature"),
        "signed by a key the API server never published": (forged(header, rank0), "invalid signature"),
        "unsigned (alg none)": (forged(header, rank0, signed=False), "unsupported signing algorithm"),
        "a real token for another audience": (pod_token(api, k8s_namespace, "signed-0", audience="other"),
                                              "not for audience trainhook"),
    }
    for what, (token, reason) in refusals.items():
        answer = call(notary, "POST", "/v1/credential", token, {})
        assert answer.status_code == 401, (what, answer.text)
        assert reason in answer.json()["error"], (what, answer.json())
    assert api_requests(api, "tokenreviews", "POST") == reviews, "a token cost a TokenReview"

    # A deleted pod's token stops working: scaled away (gone), and deleted and recreated (another uid).
    rank0_token = pod_token(api, k8s_namespace, "signed-0")
    assert call(notary, "POST", "/v1/credential", rank0_token, {}).status_code == 200
    apps.patch_namespaced_stateful_set_scale("signed", k8s_namespace, {"spec": {"replicas": 1}})
    wait_for("signed-1 gone", lambda: not any(p.metadata.name == "signed-1" for p in core.list_namespaced_pod(
        k8s_namespace).items), timeout=30)
    gone = call(notary, "POST", "/v1/credential", real, {})
    assert gone.status_code == 403 and "does not exist" in gone.json()["error"], gone.text
    old_uid = core.read_namespaced_pod("signed-0", k8s_namespace).metadata.uid
    core.delete_namespaced_pod("signed-0", k8s_namespace)
    wait_for("signed-0 recreated", lambda: any(p.metadata.name == "signed-0" and p.metadata.uid != old_uid
                                               for p in core.list_namespaced_pod(k8s_namespace).items), timeout=30)
    replaced = call(notary, "POST", "/v1/credential", rank0_token, {})
    assert replaced.status_code == 403 and "not the pod the token was issued to" in replaced.json()["error"], \
        replaced.text
    assert call(notary, "POST", "/v1/credential", pod_token(api, k8s_namespace, "signed-0"), {}).status_code == 200
    assert api_requests(api, "tokenreviews", "POST") == reviews


def flood(notary, tokens: list[str], threads: int = 4) -> list[int]:
    """POST each token to /v1/credential, `threads` keep-alive clients at once; the statuses."""
    def send(chunk: list[str]) -> list[int]:
        with requests.Session() as session:
            return [session.post(notary.notary_url + "/v1/credential", data=b"{}", verify=str(notary.ca_file),
                                 headers={"Authorization": f"Bearer {t}"}, timeout=20).status_code for t in chunk]
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        return [status for statuses in pool.map(send, [tokens[i::threads] for i in range(threads)])
                for status in statuses]


def test_ten_thousand_forged_tokens_make_no_api_call(notary, control_plane, k8s_namespace):
    api = control_plane.api_client()
    create_gang(api, k8s_namespace, "flooded", replicas=2)
    real = pod_token(api, k8s_namespace, "flooded-0")
    assert call(notary, "POST", "/v1/credential", real, {}).status_code == 200  # the discovery read happened
    header, payload = parts(real)
    tokens = [forged(header, {**payload, "jti": uuid.uuid4().hex}, signed=n % 2 == 0) for n in range(FLOOD)]
    quiet(api)
    before = {what: api_requests(api, *what) for what in (("tokenreviews", "POST"), ("pods", "GET"),
                                                          ("pods", "LIST"), ("pods", "WATCH"))}
    started = time.monotonic()
    statuses = flood(notary, tokens)
    took = time.monotonic() - started
    after = {what: api_requests(api, *what) for what in before}
    assert statuses.count(401) == FLOOD, {s: statuses.count(s) for s in set(statuses)}
    # Counted at the API server for everyone: the controller-manager and other tests' watches share it (a fresh-clone
    # CI run saw one pod GET from elsewhere in 12.5 s). A forged token used to cost a TokenReview and a pod GET each:
    # none of the first, and not one GET per ten thousand tokens of the second, is "no API call" for the notary.
    added = {what: after[what] - before[what] for what in before}
    assert added[("tokenreviews", "POST")] == 0 and sum(added.values()) <= 3, \
        f"{FLOOD} forged tokens made API calls: {before} -> {after} ({took:.1f} s)"
    assert call(notary, "POST", "/v1/credential", real, {}).status_code == 200  # members are still served


@pytest.fixture(scope="module")
def reviewing_notary(control_plane, tmp_path_factory):
    """The notary as a cluster without issuer discovery runs it: every token checked by a TokenReview."""
    hook = start_notary(control_plane, tmp_path_factory.mktemp("reviewing-notary"), "--notary-tokens", "review")
    yield hook
    hook.stop()


def test_without_published_keys_tokens_are_reviewed_at_a_bounded_rate(reviewing_notary, control_plane,
                                                                      k8s_namespace):
    from trainhook.webhook.notary.cluster import REVIEW_BURST, REVIEW_RATE
    api = control_plane.api_client()
    sts = create_gang(api, k8s_namespace, "reviewed", replicas=2)
    reviews = api_requests(api, "tokenreviews", "POST")
    real = pod_token(api, k8s_namespace, "reviewed-1")
    answer = call(reviewing_notary, "POST", "/v1/credential", real, {})
    assert answer.status_code == 200, answer.text
    assert answer.json()["key"] == expected_key(k8s_namespace, "reviewed", sts["metadata"]["uid"])[1]
    assert call(reviewing_notary, "POST", "/v1/credential", real, {}).status_code == 200  # its answer is kept
    assert api_requests(api, "tokenreviews", "POST") == reviews + 1
    assert call(reviewing_notary, "POST", "/v1/credential",
                pod_token(api, k8s_namespace, "reviewed-0", audience="other"), {}).status_code == 401

    header, payload = parts(real)
    tokens = [forged(header, {**payload, "jti": uuid.uuid4().hex}) for _ in range(1000)]
    reviews = api_requests(api, "tokenreviews", "POST")
    started = time.monotonic()
    statuses = flood(reviewing_notary, tokens)
    took = time.monotonic() - started
    made = api_requests(api, "tokenreviews", "POST") - reviews
    assert set(statuses) <= {401, 503} and statuses.count(503) > 0, {s: statuses.count(s) for s in set(statuses)}
    assert made <= REVIEW_BURST + REVIEW_RATE * took + 1, f"{made} TokenReviews in {took:.1f} s"
    assert statuses.count(401) == made  # each review refused its token; the rest were not asked about
    # The same forged token again: its refusal is remembered, no TokenReview.
    refused = next(t for t, s in zip([t for i in range(4) for t in tokens[i::4]], statuses) if s == 401)
    reviews = api_requests(api, "tokenreviews", "POST")
    assert call(reviewing_notary, "POST", "/v1/credential", refused, {}).status_code == 401
    assert api_requests(api, "tokenreviews", "POST") == reviews
