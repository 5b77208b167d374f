"""The HTTPS server: aiohttp transport around `review()`; decode, call, map errors to HTTP statuses.

`trainhook-webhook --tls-cert FILE --tls-key FILE [--host H] [--port P]`.
"""

from __future__ import annotations

import argparse
import json
import logging
import ssl
import sys

from aiohttp import web

from trainhook.webhook.review import BadReview, review
from trainhook.webhook.settings import Settings, parse_tolerations, settings_from_env

SETTINGS = web.AppKey("settings", Settings)
# The largest AdmissionReview accepted: a Kubernetes object is at most ~1.5 MiB (etcd's limit), and a
# review of an UPDATE carries two of them.
MAX_BODY = 4 * 1024 * 1024
log = logging.getLogger("trainhook.webhook")


async def mutate_handler(request: web.Request) -> web.Response:
    try:
        body = json.loads(await request.read())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        return web.json_response({"error": f"the body is not JSON: {e}"}, status=400)
    try:
        answer = review(body, request.app[SETTINGS])
    except BadReview as e:
        log.info("bad review: %s", e)
        return web.json_response({"error": str(e)}, status=400)
    return web.json_response(answer)


async def health_handler(request: web.Request) -> web.Response:
    return web.Response(text="ok")


def create_app(settings: Settings) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY)
    app[SETTINGS] = settings
    app.router.add_post("/mutate", mutate_handler)
    app.router.add_get("/healthz", health_handler)
    app.router.add_get("/readyz", health_handler)
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
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        context = tls_context(args.tls_cert, args.tls_key)
    except (OSError, ssl.SSLError) as e:
        print(f"trainhook-webhook: cannot load --tls-cert/--tls-key: {e}", file=sys.stderr)
        return 2
    web.run_app(create_app(args.settings), host=args.host, port=args.port, ssl_context=context,
                print=lambda msg: log.info(msg), shutdown_timeout=10.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
