"""The admission app: aiohttp handlers around `review()` (decode, call, map errors to HTTP statuses), /healthz,
/readyz and /metrics, and the state they read: the current Settings, the metrics, readiness.

Apart from server.py, which starts the process (flags, certificates, the order things come up in) and serves this
app, so that the request path reads on its own and a test can make the app with no process, flags or TLS.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from trainhook.webhook.serving import BUDGET, awaiting_body, guard_app
from trainhook.webhook.observability import Metrics
from trainhook.webhook.admission.jsontext import json_bytes, parse_body
from trainhook.webhook.admission.review import BadReview, review
from trainhook.webhook.settings import Settings
from trainhook.webhook.statefulset_cache import StatefulSetCache


@dataclass
class Lifecycle:
    """Server bookkeeping (never review state): reviews in flight, whether SIGTERM started a drain, and the
    readiness checks (each returns why the pod is not ready, or None)."""

    in_flight: int = 0
    draining: bool = False
    checks: list[Callable[[], str | None]] = field(default_factory=list)

    def not_ready_reason(self) -> str | None:
        if self.draining:
            return "draining"
        for check in self.checks:
            reason = check()
            if reason:
                return reason
        return None


@dataclass
class CurrentSettings:
    """The Settings each review reads: replaced whole (never changed in place) when the launcher ConfigMaps are
    written, so a review in flight keeps the one it started with."""

    settings: Settings


SETTINGS = web.AppKey("settings", CurrentSettings)
METRICS = web.AppKey("metrics", Metrics)
LIFECYCLE = web.AppKey("lifecycle", Lifecycle)
WORKLOADS = web.AppKey("workloads", StatefulSetCache)
# The largest AdmissionReview accepted: a Kubernetes object is at most ~1.5 MiB (etcd's limit), and a
# review of an UPDATE carries two of them.
MAX_BODY = 4 * 1024 * 1024
# A client must deliver its body within this; one that trickles it holds only its own connection, and then
# loses it (the API server's own webhook timeout is at most 30 s).
BODY_DEADLINE = 10.0
log = logging.getLogger("trainhook.webhook")


def bad_request(metrics: Metrics, reason: str) -> web.Response:
    metrics.bad_requests.inc()
    log.info("bad request", extra={"reason": reason})
    return web.json_response({"error": reason}, status=400)


async def mutate_handler(request: web.Request) -> web.Response:
    lifecycle = request.app[LIFECYCLE]
    lifecycle.in_flight += 1
    try:
        return await answer_review(request)
    finally:
        lifecycle.in_flight -= 1


async def answer_review(request: web.Request) -> web.Response:
    metrics, started = request.app[METRICS], time.perf_counter()
    if request.content.is_eof():  # the whole body came with the headers (a pod review does): no wait, no timer
        raw = await request.read()
    else:  # held in memory while it trickles in: within the budget all connections share (connections.py)
        budget, size = request.app[BUDGET], min(request.content_length or MAX_BODY, MAX_BODY)
        if not budget.take(size):
            return web.json_response({"error": "too many request bodies in flight; retry"}, status=503)
        try:  # evictable while it waits (connections.py): a head whose body never comes must not hold a slot
            async with asyncio.timeout(BODY_DEADLINE):
                with awaiting_body(request):
                    raw = await request.read()
        except TimeoutError:
            return bad_request(metrics, f"the body did not arrive within {BODY_DEADLINE:.0f} s")
        finally:
            budget.give(size)
    try:
        body = parse_body(raw)
        reviewed = review(body, request.app[SETTINGS].settings, request.app.get(WORKLOADS))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        return bad_request(metrics, f"the body is not JSON: {e}")
    except BadReview as e:
        return bad_request(metrics, str(e))
    except RecursionError:  # json.loads or the walks over the object (jsondiff): no Kubernetes object nests so
        return bad_request(metrics, "the body nests arrays or objects too deeply for an AdmissionReview")
    metrics.admitted(reviewed.kind, reviewed.outcome)
    for reason in reviewed.reasons:
        metrics.refusals.labels(reason).inc()
    metrics.latency.observe(time.perf_counter() - started)
    if reviewed.outcome == "denied":
        log.info("denied", extra={"kind": reviewed.kind, "uid": reviewed.answer["response"]["uid"],
                                  "reasons": reviewed.reasons})
    return web.Response(body=json_bytes(reviewed.answer), content_type="application/json")


async def health_handler(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def ready_handler(request: web.Request) -> web.Response:
    reason = request.app[LIFECYCLE].not_ready_reason()
    if reason:
        return web.Response(text=reason, status=503)
    return web.Response(text="ok")


async def metrics_handler(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def create_app(settings: Settings) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY)
    app[SETTINGS] = CurrentSettings(settings)
    app[METRICS] = Metrics()
    app[LIFECYCLE] = Lifecycle()
    guard_app(app)  # connection cap, head deadline, body budget
    app.router.add_post("/mutate", mutate_handler)
    app.router.add_get("/healthz", health_handler)
    app.router.add_get("/readyz", ready_handler)
    app.router.add_get("/metrics", metrics_handler)
    return app
