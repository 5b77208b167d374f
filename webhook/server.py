"""The HTTPS server: aiohttp transport around `review()`; decode, call, map errors to HTTP statuses.

`trainhook-webhook --tls-cert FILE --tls-key FILE [--host H] [--port P]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import ssl
import sys
import signal
import time
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from trainhook.webhook.observability import Metrics, configure_logging
from trainhook.webhook.review import BadReview, review
from trainhook.webhook.settings import Settings, parse_tolerations, settings_from_env

@dataclass
class Lifecycle:
    """Server bookkeeping (never review state): reviews in flight, and whether SIGTERM started a drain."""

    in_flight: int = 0
    draining: bool = False


SETTINGS = web.AppKey("settings", Settings)
METRICS = web.AppKey("metrics", Metrics)
LIFECYCLE = web.AppKey("lifecycle", Lifecycle)
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
    try:
        async with asyncio.timeout(BODY_DEADLINE):
            raw = await request.read()
    except TimeoutError:
        return bad_request(metrics, f"the body did not arrive within {BODY_DEADLINE:.0f} s")
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        return bad_request(metrics, f"the body is not JSON: {e}")
    try:
        reviewed = review(body, request.app[SETTINGS])
    except BadReview as e:
        return bad_request(metrics, str(e))
    metrics.admissions.labels(reviewed.kind, reviewed.outcome).inc()
    for reason in reviewed.reasons:
        metrics.refusals.labels(reason).inc()
    metrics.latency.observe(time.perf_counter() - started)
    if reviewed.outcome == "denied":
        log.info("denied", extra={"kind": reviewed.kind, "uid": reviewed.answer["response"]["uid"],
                                  "reasons": reviewed.reasons})
    return web.json_response(reviewed.answer)


async def health_handler(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def ready_handler(request: web.Request) -> web.Response:
    if request.app[LIFECYCLE].draining:
        return web.Response(text="draining", status=503)
    return web.Response(text="ok")


async def metrics_handler(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def create_app(settings: Settings) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY)
    app[SETTINGS] = settings
    app[METRICS] = Metrics()
    app[LIFECYCLE] = Lifecycle()
    app.router.add_post("/mutate", mutate_handler)
    app.router.add_get("/healthz", health_handler)
    app.router.add_get("/readyz", ready_handler)
    app.router.add_get("/metrics", metrics_handler)
    return app


def tls_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """TLS 1.2 or newer only, as the API server's webhook client and current guidance expect."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    return context


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    env = settings_from_env()
    defaults = Settings(**env)
    parser = argparse.ArgumentParser(prog="trainhook-webhook", description=(
        "trainhook's mutating admission webhook: wires labeled Pods, StatefulSets, Jobs and Services into "
        "distributed-training gangs. Settings also come from TRAINHOOK_WEBHOOK_* environment variables."))
    parser.add_argument("--tls-cert", required=True, help="PEM certificate chain served to the API server")
    parser.add_argument("--tls-key", required=True, help="PEM private key of --tls-cert")
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    parser.add_argument("--port", type=int, default=9443, help="port to listen on (default 9443)")
    parser.add_argument("--launcher-image", default=defaults.launcher_image,
                        help="image of the gang-wait init container (env TRAINHOOK_WEBHOOK_LAUNCHER_IMAGE)")
    parser.add_argument("--tolerations", default=None,
                        help="JSON list of tolerations added to every training pod (env TRAINHOOK_WEBHOOK_TOLERATIONS)")
    parser.add_argument("--cluster-domain", default=defaults.cluster_domain,
                        help="the cluster's DNS domain (env TRAINHOOK_WEBHOOK_CLUSTER_DOMAIN)")
    parser.add_argument("--wait-timeout", type=int, default=defaults.wait_timeout,
                        help="seconds the gang wait gives peers (env TRAINHOOK_WEBHOOK_WAIT_TIMEOUT)")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    try:
        tolerations = (parse_tolerations(args.tolerations) if args.tolerations is not None
                       else defaults.extra_tolerations)
    except ValueError as e:
        parser.error(str(e))
    args.settings = Settings(launcher_image=args.launcher_image, extra_tolerations=tolerations,
                             cluster_domain=args.cluster_domain, wait_timeout=args.wait_timeout)
    return args


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except ValueError as e:
        print(f"trainhook-webhook: {e}", file=sys.stderr)
        return 2
    configure_logging(args.log_level)
    try:
        context = tls_context(args.tls_cert, args.tls_key)
    except (OSError, ssl.SSLError) as e:
        print(f"trainhook-webhook: cannot load --tls-cert/--tls-key: {e}", file=sys.stderr)
        return 2
    asyncio.run(serve(create_app(args.settings), args.host, args.port, context))
    return 0


async def serve(app: web.Application, host: str, port: int, context: ssl.SSLContext,
                drain_timeout: float = BODY_DEADLINE + 5) -> None:
    """Serve until SIGTERM/SIGINT, then drain: /readyz turns 503 (so the Service stops routing here), reviews
    keep being answered until none is in flight (or the deadline passes), and only then the server stops."""
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port, ssl_context=context).start()
    log.info("serving", extra={"host": host, "port": port})
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    lifecycle = app[LIFECYCLE]
    lifecycle.draining = True
    log.info("draining", extra={"in_flight": lifecycle.in_flight})
    deadline = loop.time() + drain_timeout
    while lifecycle.in_flight and loop.time() < deadline:
        await asyncio.sleep(0.05)
    await runner.cleanup()
    log.info("stopped", extra={"in_flight": lifecycle.in_flight})


if __name__ == "__main__":
    sys.exit(main())
