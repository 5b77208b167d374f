"""The notary's authority in a cluster: TokenReview and the API server, with the webhook's own ServiceAccount.

Every call is one the chart's notary ClusterRole grants, with its reason (docs/operate/security.md, "Every permission
the chart grants"): tokenreviews create; pods get/list; statefulsets get/patch; statefulsets/scale patch; jobs
get/patch; events create. The `kubernetes` client is blocking: each call runs on a thread of the authority's own
pool (sized to the client's connection pool, so a gang's burst neither waits on the event loop's small default
executor, shared with the webhook's other work, nor opens connections the pool then throws away), under a
timeout. Calls go by raw paths and answer plain dicts with the API's own field names (what the webhook's gang
model reads): the client's model classes are never built. Any failure but a 404 (gone) or a 409 (someone wrote
first) is `Unreachable`: the notary answers 503 and the launcher retries.

A token that is not a JWT naming a pod and audience `trainhook` is refused without a TokenReview: the review
could not name a pod for it (notary_membership.identity_from_review would refuse it), so a flood of garbage
tokens costs the API server nothing.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
from typing import Any

from trainhook.gang import keys
from trainhook.webhook.notary.authority import Conflict, Unreachable
from trainhook.webhook.notary.membership import token_claims

API_TIMEOUT = 5.0  # seconds per API call (the launcher retries a 503)
MIN_THREADS, MAX_THREADS = 4, 32
IDENTITY_AUDIENCES = [keys.IDENTITY_AUDIENCE]
PATHS = {"StatefulSet": "/apis/apps/v1/namespaces/{namespace}/statefulsets/{name}",
         "Job": "/apis/batch/v1/namespaces/{namespace}/jobs/{name}"}


class ClusterAuthority:
    def __init__(self, api_client: Any, timeout: float = API_TIMEOUT):
        self.api = api_client
        self.timeout = timeout
        pool = getattr(getattr(api_client, "configuration", None), "connection_pool_maxsize", None) or MIN_THREADS
        self.threads = concurrent.futures.ThreadPoolExecutor(max(MIN_THREADS, min(MAX_THREADS, pool)),
                                                             thread_name_prefix="notary-api")

    def _call_blocking(self, method: str, path: str, body: object, content_type: str, query: list):
        """One API call (the client's own transport, auth and CA) answering the decoded JSON, or None on 404."""
        try:
            method, url, headers, body, post = self.api.param_serialize(
                method, path, query_params=query, body=body, auth_settings=["BearerToken"],
                header_params={"Content-Type": content_type, "Accept": "application/json"})
            response = self.api.call_api(method, url, header_params=headers, body=body, post_params=post,
                                         _request_timeout=self.timeout)
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
        return json.loads(data) if data else {}

    async def _call(self, method: str, path: str, body: object = None, content_type: str = "application/json",
                    query: list | None = None) -> Any:
        try:
            async with asyncio.timeout(self.timeout + 1):
                return await asyncio.get_running_loop().run_in_executor(
                    self.threads, self._call_blocking, method, path, body, content_type, query or [])
        except TimeoutError:
            raise Unreachable(f"{method} {path}: no answer within {self.timeout:g} s") from None

    async def review_token(self, token: str) -> dict:
        claims = token_claims(token)
        if claims is None:
            return {"authenticated": False, "error": "it is not a pod's ServiceAccount token (a JWT naming a pod)"}
        if claims.audiences and keys.IDENTITY_AUDIENCE not in claims.audiences:
            return {"authenticated": False, "error": "the token is not for audience trainhook"}
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

    async def list_gang_pods(self, namespace: str, job: str) -> list[dict]:
        answer = await self._call("GET", f"/api/v1/namespaces/{namespace}/pods",
                                  query=[("labelSelector", f"{keys.JOB_NAME}={job}")])
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
