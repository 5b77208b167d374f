"""The notary's authority in a cluster: TokenReview and the API server, with the webhook's own ServiceAccount.

Every call is one the chart's notary ClusterRole grants, with its reason (docs/operate/security.md, "Every
permission the chart grants"): tokenreviews create; pods get/list/watch; statefulsets get/patch; statefulsets/scale
patch; jobs get/list/patch (list: the sweep); events create. The `kubernetes` client is blocking: each call runs on
a thread of the authority's own pool (sized to the client's connection pool, so a gang's burst neither waits on the
event loop's small default executor, shared with the webhook's other work, nor opens connections the pool then
throws away), under a timeout. Calls go by raw paths and answer plain dicts with the API's own field names (what the
webhook's gang model reads): the client's model classes are never built. Any failure but a 404 (gone) or a 409
(someone wrote first) is `Unreachable`: the notary answers 503 and the launcher retries.

A token that is not a JWT naming a pod and audience `trainhook` is refused without a TokenReview: the review
could not name a pod for it (notary_membership.identity_from_review would refuse it), so a flood of garbage
tokens costs the API server nothing.

Tokens are verified locally against the API server's published keys where it serves them (webhook/notary/jwks.py,
issue 31 item 3): then no token, forged or not, costs a TokenReview. Where it does not (feature detection, in
jwks.py), TokenReview is the fallback, at most REVIEW_RATE a second (REVIEW_BURST at once): beyond that the
caller is answered 503 (Retry-After) and the API server is not asked, so a flood of made-up tokens costs the API
server a bounded rate. A credential call reads its pod from the namespace's watch of gang pods
(webhook/notary/pod_watch.py: `member_pod`), not with a GET each.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from typing import Any

from trainhook.gang import keys
from trainhook.webhook.notary.authority import Conflict, Unreachable
from trainhook.webhook.notary.jwks import Jwks
from trainhook.webhook.notary.membership import token_claims
from trainhook.webhook.admission.jsontext import parse_body
from trainhook.webhook.notary.pod_watch import WATCH_SECONDS, PodWatches

API_TIMEOUT = 5.0  # seconds per API call (the launcher retries a 503)
MIN_THREADS, MAX_THREADS = 4, 32
IDENTITY_AUDIENCES = [keys.IDENTITY_AUDIENCE]
JWKS_ACCEPT = "application/json, application/jwk-set+json"
REVIEW_RATE, REVIEW_BURST = 50.0, 100  # TokenReviews a second, and at once, where tokens cannot be checked here
PATHS = {"StatefulSet": "/apis/apps/v1/namespaces/{namespace}/statefulsets/{name}",
         "Job": "/apis/batch/v1/namespaces/{namespace}/jobs/{name}"}


class TokenBucket:
    """`rate` a second, `burst` at once: `take()` is False when the caller must not go on now."""

    def __init__(self, rate: float, burst: int, clock=time.monotonic) -> None:
        self.rate, self.burst, self.clock = rate, burst, clock
        self.tokens, self.last = float(burst), clock()

    def take(self) -> bool:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
        self.last = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


class WatchStream:
    """A watch's answer read line by line (one JSON event a line), closed by `close()`."""

    def __init__(self, response: Any) -> None:
        self.response = response

    def stream_lines(self):
        buffered = b""
        for chunk in self.response.stream(64 * 1024):
            buffered += chunk
            *lines, buffered = buffered.split(b"\n")
            yield from (line for line in lines if line.strip())

    def close(self) -> None:
        self.response.release_conn()


class ClusterAuthority:
    def __init__(self, api_client: Any, timeout: float = API_TIMEOUT, local_tokens: bool = True):
        """`local_tokens`: verify tokens against the published keys where served (False: TokenReview always,
        for tests of the fallback)."""
        self.api = api_client
        self.timeout = timeout
        pool = getattr(getattr(api_client, "configuration", None), "connection_pool_maxsize", None) or MIN_THREADS
        self.threads = concurrent.futures.ThreadPoolExecutor(max(MIN_THREADS, min(MAX_THREADS, pool)),
                                                             thread_name_prefix="notary-api")
        # The keys are served only as application/jwk-set+json (406 for application/json, seen on v1.20).
        self.jwks = Jwks(lambda path: self._call("GET", path, accept=JWKS_ACCEPT)) if local_tokens else None
        self.reviews = TokenBucket(REVIEW_RATE, REVIEW_BURST)
        self.pods = PodWatches(self._list_gang_pods_blocking, self._watch_gang_pods_blocking)

    def _send(self, method: str, path: str, body: object, content_type: str, query: list, timeout: Any,
              accept: str = "application/json"):
        method, url, headers, body, post = self.api.param_serialize(
            method, path, query_params=query, body=body, auth_settings=["BearerToken"],
            header_params={"Content-Type": content_type, "Accept": accept})
        return self.api.call_api(method, url, header_params=headers, body=body, post_params=post,
                                 _request_timeout=timeout)

    def _call_blocking(self, method: str, path: str, body: object, content_type: str, query: list,
                       accept: str = "application/json"):
        """One API call (the client's own transport, auth and CA) answering the decoded JSON, or None on 404."""
        try:
            response = self._send(method, path, body, content_type, query, self.timeout, accept)
            data = response.read()
        except Exception as e:  # noqa: BLE001 - urllib3's and the client's many kinds: all mean "not now"
            raise Unreachable(f"{method} {path}: {e}") from e
        if response.status == 404:
            return None
        if response.status == 409:
            raise Conflict(f"{method} {path}: {response.reason}")
        if not 200 <= response.status < 300:
            text = (data or b"")[:300].decode(errors="replace")
            raise Unreachable(f"{method} {path}: HTTP {response.status} {response.reason}: {text}")
        return parse_body(data) if data else {}

    async def _call(self, method: str, path: str, body: object = None, content_type: str = "application/json",
                    query: list | None = None, accept: str = "application/json") -> Any:
        try:
            async with asyncio.timeout(self.timeout + 1):
                return await asyncio.get_running_loop().run_in_executor(
                    self.threads, self._call_blocking, method, path, body, content_type, query or [], accept)
        except TimeoutError:
            raise Unreachable(f"{method} {path}: no answer within {self.timeout:g} s") from None

    async def review_token(self, token: str) -> dict:
        claims = token_claims(token)
        if claims is None:
            return {"authenticated": False, "error": "it is not a pod's ServiceAccount token (a JWT naming a pod)"}
        if claims.audiences and keys.IDENTITY_AUDIENCE not in claims.audiences:
            return {"authenticated": False, "error": "the token is not for audience trainhook"}
        if self.jwks is not None and await self.jwks.served():
            return await self.jwks.review(token)
        if not self.reviews.take():
            raise Unreachable(f"more than {REVIEW_RATE:g} TokenReviews a second asked (this API server does not "
                              "publish its keys, so each token costs one): retry")
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                "spec": {"token": token, "audiences": IDENTITY_AUDIENCES}}
        answer = await self._call("POST", "/apis/authentication.k8s.io/v1/tokenreviews", body)
        status = (answer or {}).get("status") or {}
        if status.get("authenticated") and keys.IDENTITY_AUDIENCE not in (status.get("audiences") or
                                                                           IDENTITY_AUDIENCES):
            return {"authenticated": False, "error": "the token is not for audience trainhook"}
        return status

    async def get_pod(self, namespace: str, name: str) -> dict | None:
        return await self._call("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")

    async def member_pod(self, namespace: str, name: str, uid: str) -> tuple[dict | None, bool]:
        """A credential call's pod: from the namespace's watch when it holds it with `uid`, else a GET; and
        whether it was a GET (a fresh read)."""
        watched = self.pods.lookup(namespace, name, uid)
        if watched is None and await self.pods.first_list(namespace):
            watched = self.pods.lookup(namespace, name, uid)
        if watched is not None:
            return watched, False
        return await self.get_pod(namespace, name), True

    def _list_gang_pods_blocking(self, namespace: str) -> bytes:
        """The namespace's gang pods as the API server answered them (JSON text: pod_watch.listed_pods decodes it
        with the collector paused)."""
        response = self._send("GET", f"/api/v1/namespaces/{namespace}/pods", None, "application/json",
                              [("labelSelector", keys.JOB_NAME)], (self.timeout, 60))
        if response.status != 200:
            raise RuntimeError(f"list pods of {namespace}: HTTP {response.status} {response.reason}")
        return response.read()

    def _watch_gang_pods_blocking(self, namespace: str, version: str) -> WatchStream:
        response = self._send("GET", f"/api/v1/namespaces/{namespace}/pods", None, "application/json",
                              [("labelSelector", keys.JOB_NAME), ("watch", "true"), ("resourceVersion", version),
                               ("timeoutSeconds", str(WATCH_SECONDS)), ("allowWatchBookmarks", "true")],
                              (self.timeout, WATCH_SECONDS + 30))
        if response.status != 200:
            raise RuntimeError(f"watch pods of {namespace}: HTTP {response.status} {response.reason}")
        return WatchStream(response.response)

    async def list_gang_pods(self, namespace: str, job: str) -> list[dict]:
        answer = await self._call("GET", f"/api/v1/namespaces/{namespace}/pods",
                                  query=[("labelSelector", f"{keys.JOB_NAME}={job}")])
        return list((answer or {}).get("items") or [])

    async def list_unrecorded_jobs(self, namespace: str = "") -> list[dict]:
        """The Jobs labeled trainhook.dev/framework (every gang Job is: the webhook admits only those) with no
        recorded phase, in `namespace` or every namespace: what the sweep looks at (webhook/notary/sweep.py)."""
        path = f"/apis/batch/v1/namespaces/{namespace}/jobs" if namespace else "/apis/batch/v1/jobs"
        answer = await self._call("GET", path, query=[("labelSelector", f"{keys.FRAMEWORK},!{keys.PHASE}")])
        return list((answer or {}).get("items") or [])

    async def get_workload(self, namespace: str, kind: str, name: str) -> dict | None:
        return await self._call("GET", PATHS[kind].format(namespace=namespace, name=name))

    async def patch_workload(self, namespace: str, kind: str, name: str, patch: dict) -> None:
        answer = await self._call("PATCH", PATHS[kind].format(namespace=namespace, name=name), patch,
                                  "application/merge-patch+json")
        if answer is None:
            raise Unreachable(f"{kind}/{name} is gone")

    async def scale_to_zero(self, namespace: str, name: str) -> None:
        await self._call("PATCH", PATHS["StatefulSet"].format(namespace=namespace, name=name) + "/scale",
                         {"spec": {"replicas": 0}}, "application/merge-patch+json")

    async def create_event(self, namespace: str, body: dict) -> None:
        try:
            await self._call("POST", f"/api/v1/namespaces/{namespace}/events", body)
        except Conflict:
            pass  # this record's Event exists already (a retry)
