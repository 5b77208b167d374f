"""The HTTPS server: aiohttp transport around `review()`; decode, call, map errors to HTTP statuses.

`trainhook-webhook --tls-cert FILE --tls-key FILE [--host H] [--port P]` serves a mounted certificate
(certificate modes `secret` and `cert-manager`) and reloads it when the files change;
`trainhook-webhook --cert-mode self-managed --secret-name S --webhook-config-name W --service-name SVC
--namespace NS` keeps its own CA and serving pair in the Secret S and the caBundle of W (webhook/selfcerts.py).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import secrets
import signal
import ssl
import sys
import time
from pathlib import Path
from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from trainhook.webhook import launcher_configmap, notary
from trainhook.webhook.connections import BUDGET, app_runner, guard_app, serve_app
from trainhook.webhook.gang_key import GangKey
from trainhook.webhook.observability import Metrics, configure_logging
from trainhook.webhook.review import BadReview, json_bytes, review
from trainhook.webhook.selfcerts import SelfManagedCerts, kube_client, service_hostnames
from trainhook.webhook.statefulset_cache import StatefulSetCache, start_background
from trainhook.webhook.settings import (CERT_ENV, CERT_MODES, CertSettings, Settings, cert_settings_from_env,
                                        parse_namespaces, parse_sans, parse_tolerations, settings_from_env)
from trainhook.webhook.tlsreload import BadPair, CertReloader, server_context
from trainhook.webhook.tolerations import parse_namespaces as parse_toleration_namespaces


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
        try:
            async with asyncio.timeout(BODY_DEADLINE):
                raw = await request.read()
        except TimeoutError:
            return bad_request(metrics, f"the body did not arrive within {BODY_DEADLINE:.0f} s")
        finally:
            budget.give(size)
    try:
        body = json.loads(raw)
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


def tls_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """TLS 1.2 or newer only, as the API server's webhook client and current guidance expect."""
    context = server_context()
    context.load_cert_chain(cert_file, key_file)
    return context


def watch_certificates(app: web.Application, reloader: CertReloader, reload_interval: float,
                       manager: SelfManagedCerts | None = None, sync_interval: float = 60.0) -> None:
    """Keep the served certificate current while `app` runs: poll the files (and, self-managed, sync the
    Secret and the caBundle); readiness waits for a loaded certificate the caBundle trusts."""

    async def background(app: web.Application):
        jobs = [asyncio.create_task(reloader.watch(reload_interval))]
        if manager is not None:
            # After each sync the new files are looked at at once, not at the next poll.
            jobs.append(asyncio.create_task(manager.run(sync_interval, after_sync=reloader.check)))
        yield
        for job in jobs:
            job.cancel()
        await asyncio.gather(*jobs, return_exceptions=True)

    app.cleanup_ctx.append(background)
    if manager is not None:
        app[LIFECYCLE].checks.append(lambda: manager.not_ready_reason(reloader.loaded))
    else:
        app[LIFECYCLE].checks.append(lambda: None if reloader.loaded else "no serving certificate loaded yet")


def keep_launcher_configmaps(app: web.Application, api_client, namespaces: tuple[str, ...],
                            interval: float = 60.0, owner: str = "") -> None:
    """Write the launcher ConfigMap into `namespaces` before turning ready, then check it every `interval` (someone
    may replace it; old versions go); reviews use it where it was written and checked (webhook/launcher_configmap.py).
    `owner`: the release's ClusterRole that owns them, so that helm uninstall removes them."""
    from kubernetes import client
    zip_bytes, shim = launcher_configmap.content()
    name = launcher_configmap.configmap_name(zip_bytes, shim)
    published: list[bool] = []

    async def keep(app: web.Application):
        async def loop():
            keeper = None  # made once; again only while it could not be made (no API config yet)
            while True:
                try:
                    if keeper is None:
                        api = api_client or kube_client()
                        keeper = launcher_configmap.Keeper(client.CoreV1Api(api), namespaces, zip_bytes, shim,
                                                           owner=owner, rbac_api=client.RbacAuthorizationV1Api(api))
                    done = await asyncio.to_thread(keeper.round)
                except Exception as e:  # noqa: BLE001  no API at all: serve with the init container, say why
                    log.warning("cannot write the launcher ConfigMaps; pods get the gang-wait init container",
                                extra={"error": str(e)})
                    done = frozenset()
                current = app[SETTINGS]
                if done != current.settings.launcher_namespaces or not published:
                    current.settings = dataclasses.replace(current.settings, launcher_configmap=name,
                                                           launcher_namespaces=done)
                    log.info("launcher ConfigMap", extra={"configmap": name, "namespaces": sorted(done)})
                published[:] = [True]
                await asyncio.sleep(interval)
        job = asyncio.create_task(loop())
        yield
        job.cancel()
        await asyncio.gather(job, return_exceptions=True)

    app.cleanup_ctx.append(keep)
    app[LIFECYCLE].checks.append(lambda: None if published else "the launcher ConfigMaps are not written yet")


def keep_gang_key(app: web.Application, keeper: GangKey, interval: float = 30.0) -> None:
    """Look at the gang key's Secret every `interval` while `app` runs; a key changed there replaces the Settings'
    (webhook/gang_key.py: the Secret is the truth, so replicas converge within one interval)."""
    def adopted(key: bytes) -> None:
        current = app[SETTINGS]
        current.settings = dataclasses.replace(current.settings, gang_key=key)

    async def background(app: web.Application):
        job = asyncio.create_task(keeper.keep(interval, adopted))
        yield
        job.cancel()
        await asyncio.gather(job, return_exceptions=True)

    app.cleanup_ctx.append(background)


def watch_statefulsets(app: web.Application, api_client) -> StatefulSetCache:
    """Keep the gang StatefulSets scale reviews are checked against (webhook/statefulset_cache.py) while `app` runs.
    Readiness does not wait for it: until the first list a scale is allowed with a warning, as when we are down."""
    cache = app[WORKLOADS] = StatefulSetCache()

    async def background(app: web.Application):
        thread, stop = start_background(cache, api_client or kube_client())
        yield
        stop.set()

    app.cleanup_ctx.append(background)
    return cache


def serve_notary(app: web.Application, args: argparse.Namespace, context: ssl.SSLContext, api_client=None) -> None:
    """The notary (webhook/notary.py): a second HTTPS listener on --notary-port with the webhook's own TLS context,
    up and down with `app`; only with --notary-authority cluster or local:DIR."""
    if args.notary_authority == "none":
        return
    notary_app = notary.create_app(notary.Notary(notary.authority_from(args, api_client),
                                                 lambda: app[SETTINGS].settings.gang_key))
    # Every pod may reach this port (the chart's NetworkPolicy opens it to all): the same connection cap, head
    # deadline and head bounds as the admission port (connections.py), not a bare TCPSite that idle clients fill.
    guard_app(notary_app)

    async def listener(app: web.Application):
        runner = app_runner(notary_app)
        await runner.setup()
        accepting, sock = serve_app(runner, args.host, args.notary_port, context)
        log.info("notary serving", extra={"host": args.host, "port": args.notary_port, "url": args.notary_url})
        yield
        accepting.cancel()
        sock.close()
        await runner.cleanup()

    app.cleanup_ctx.append(listener)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    env = settings_from_env()
    defaults = Settings(**env)
    try:
        cert_defaults = CertSettings(**cert_settings_from_env())
    except ValueError as e:
        raise ValueError(f"bad certificate setting in the environment: {e}") from e
    parser = argparse.ArgumentParser(prog="trainhook-webhook", description=(
        "trainhook's mutating admission webhook: wires labeled Pods, StatefulSets, Jobs and Services into "
        "distributed-training gangs. Settings also come from TRAINHOOK_WEBHOOK_* environment variables."))
    parser.add_argument("--tls-cert", help="PEM certificate chain served to the API server; reloaded when it "
                        "changes (required unless --cert-mode self-managed)")
    parser.add_argument("--tls-key", help="PEM private key of --tls-cert")
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    parser.add_argument("--port", type=int, default=9443, help="port to listen on (default 9443)")
    parser.add_argument("--launcher-image", default=defaults.launcher_image,
                        help="image of the gang-wait init container (env TRAINHOOK_WEBHOOK_LAUNCHER_IMAGE)")
    parser.add_argument("--tolerations", default=None,
                        help="JSON list of tolerations for training pods, an entry may say requiresResource "
                             "(env TRAINHOOK_WEBHOOK_TOLERATIONS; webhook/tolerations.py)")
    parser.add_argument("--toleration-namespaces", default=None,
                        help="comma-separated namespaces whose training pods get --tolerations, '*' for every one; "
                             "none: no pod gets them (env TRAINHOOK_WEBHOOK_TOLERATION_NAMESPACES)")
    parser.add_argument("--cluster-domain", default=defaults.cluster_domain,
                        help="the cluster's DNS domain (env TRAINHOOK_WEBHOOK_CLUSTER_DOMAIN)")
    parser.add_argument("--wait-timeout", type=int, default=defaults.wait_timeout,
                        help="seconds the gang wait gives peers (env TRAINHOOK_WEBHOOK_WAIT_TIMEOUT)")
    parser.add_argument("--gang-key-file", default=None,
                        help="file holding the key gang tokens are derived from; every replica must share it "
                             "(env TRAINHOOK_WEBHOOK_GANG_KEY holds the key itself; the chart keeps it in a Secret)")
    parser.add_argument("--gang-key-secret", default=os.environ.get("TRAINHOOK_WEBHOOK_GANG_KEY_SECRET", ""),
                        help="the Secret (in --namespace) holding the gang key: read before serving, created once "
                             "when missing, looked at again every 30 s (webhook/gang_key.py; env "
                             "TRAINHOOK_WEBHOOK_GANG_KEY_SECRET, which the chart sets)")
    parser.add_argument("--no-gang-key-create", dest="gang_key_create", action="store_false",
                        default=os.environ.get("TRAINHOOK_WEBHOOK_GANG_KEY_CREATE", "true") not in ("0", "false"),
                        help="only read --gang-key-secret, never create it (env TRAINHOOK_WEBHOOK_GANG_KEY_CREATE="
                             "false; the chart's gangKey.existingSecret)")
    parser.add_argument("--launcher-namespaces", default=os.environ.get("TRAINHOOK_WEBHOOK_LAUNCHER_NAMESPACES", ""),
                        help="comma-separated namespaces where the webhook keeps the launcher ConfigMap, so their "
                             "pods start without an init container (env TRAINHOOK_WEBHOOK_LAUNCHER_NAMESPACES; the "
                             "chart sets its trainingNamespaces)")
    parser.add_argument("--watch-statefulsets", action="store_true",
                        default=os.environ.get("TRAINHOOK_WEBHOOK_WATCH_STATEFULSETS", "") in ("1", "true"),
                        help="watch StatefulSets (in-cluster or KUBECONFIG) to check statefulsets/scale reviews "
                             "(env TRAINHOOK_WEBHOOK_WATCH_STATEFULSETS=true; the chart's scaleCheck sets it)")
    parser.add_argument("--log-level", default="INFO")
    notary.add_arguments(parser)
    certs = parser.add_argument_group("certificates", "self-managed: the webhook keeps its CA and serving pair "
                                      "in one Secret and writes the caBundle of its webhook configuration")
    certs.add_argument("--cert-mode", choices=CERT_MODES, default=cert_defaults.mode,
                       help=f"where the certificate comes from (env {CERT_ENV['mode']}; default %(default)s)")
    certs.add_argument("--tls-reload-interval", type=float, default=cert_defaults.reload_interval,
                       help="seconds between two looks at the certificate files "
                            f"(env {CERT_ENV['reload_interval']}; default %(default)s)")
    for name, meaning in [("secret-name", "the Secret holding the CA and the serving pair"),
                          ("webhook-config-name", "the MutatingWebhookConfiguration whose caBundle is kept"),
                          ("service-name", "the webhook's Service (the certificate carries its DNS names)"),
                          ("namespace", "the namespace of the Secret and the Service"),
                          ("pod-name", "this pod's name (recorded on the Secret when it writes it)"),
                          ("cert-dir", "a writable directory for the serving pair")]:
        field_name = name.replace("-", "_")
        certs.add_argument(f"--{name}", default=getattr(cert_defaults, field_name),
                           help=f"self-managed: {meaning} (env {CERT_ENV[field_name]})")
    certs.add_argument("--extra-sans", default=None,
                       help=f"self-managed: more comma-separated DNS names or IPs for the certificate, e.g. for a "
                            f"webhook called by URL (env {CERT_ENV['extra_sans']})")
    certs.add_argument("--cert-sync-interval", type=float, default=cert_defaults.sync_interval,
                       help=f"self-managed: seconds between two syncs, jittered ±20%% "
                            f"(env {CERT_ENV['sync_interval']}; default %(default)s)")
    args = parser.parse_args(argv)
    try:
        tolerations = (parse_tolerations(args.tolerations) if args.tolerations is not None
                       else defaults.extra_tolerations)
    except ValueError as e:
        parser.error(str(e))
    gang_key = defaults.gang_key
    if args.gang_key_file:
        try:
            gang_key = Path(args.gang_key_file).read_bytes().strip()
        except OSError as e:
            parser.error(f"--gang-key-file: {e}")
    if not gang_key and not args.gang_key_secret:  # with a Secret, run() loads the key before serving
        # One process alone (a local run, a test) is consistent with itself; replicas are not: say so.
        gang_key = secrets.token_bytes(32)
        args.gang_key_generated = True
    toleration_namespaces = (parse_toleration_namespaces(args.toleration_namespaces)
                             if args.toleration_namespaces is not None else defaults.toleration_namespaces)
    args.settings = Settings(launcher_image=args.launcher_image, extra_tolerations=tolerations,
                             toleration_namespaces=toleration_namespaces,
                             cluster_domain=args.cluster_domain, wait_timeout=args.wait_timeout,
                             gang_key=gang_key)
    args.launcher_namespaces = parse_namespaces(args.launcher_namespaces)
    args.certs = CertSettings(
        mode=args.cert_mode, cert_file=args.tls_cert, key_file=args.tls_key,
        reload_interval=args.tls_reload_interval, secret_name=args.secret_name,
        webhook_config_name=args.webhook_config_name, service_name=args.service_name,
        namespace=args.namespace, pod_name=args.pod_name, cert_dir=args.cert_dir,
        extra_sans=parse_sans(args.extra_sans) if args.extra_sans is not None else cert_defaults.extra_sans,
        sync_interval=args.cert_sync_interval)
    if args.certs.mode != "self-managed" and args.certs.missing():
        parser.error(f"--cert-mode {args.certs.mode} serves files: {' and '.join(args.certs.missing())} required")
    problem = notary.check_arguments(args)
    if problem:
        parser.error(problem)
    args.settings = notary.notary_settings(args.settings, args)
    return args


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except ValueError as e:
        print(f"trainhook-webhook: {e}", file=sys.stderr)
        return 2
    configure_logging(args.log_level)
    if getattr(args, "gang_key_generated", False):
        log.warning("no gang key configured (TRAINHOOK_WEBHOOK_GANG_KEY or --gang-key-file): using a random one; "
                    "gang tokens will differ between webhook replicas and restarts")
    missing = args.certs.missing()
    if missing:
        print(f"trainhook-webhook: --cert-mode {args.certs.mode} needs {', '.join(missing)} "
              "(or their TRAINHOOK_WEBHOOK_* variables, which the chart sets)", file=sys.stderr)
        return 2
    return asyncio.run(run(args))


async def run(args: argparse.Namespace) -> int:
    """Get the first certificate (self-managed: sync until the Secret is settled), then serve."""
    certs: CertSettings = args.certs
    manager = None
    if certs.mode == "self-managed":
        try:
            api_client = kube_client()
        except Exception as e:  # noqa: BLE001 - the client's loaders raise several unrelated types
            print(f"trainhook-webhook: cannot reach the Kubernetes API (in-cluster or KUBECONFIG): {e}",
                  file=sys.stderr)
            return 2
        hostnames = [*service_hostnames(certs.service_name, certs.namespace, args.settings.cluster_domain),
                     *certs.extra_sans]
        manager = SelfManagedCerts(api_client, namespace=certs.namespace, secret_name=certs.secret_name,
                                   webhook_config_name=certs.webhook_config_name, hostnames=hostnames,
                                   cert_dir=certs.cert_dir, identity=certs.pod_name)
        log.info("self-managed certificates", extra={"secret": certs.secret_name, "hostnames": hostnames,
                                                     "webhook_configuration": certs.webhook_config_name})
        await manager.start()
        cert_file, key_file = str(manager.cert_file), str(manager.key_file)
    else:  # main refused a mode that serves files without both
        cert_file, key_file = certs.cert_file or "", certs.key_file or ""
    reloader = CertReloader(cert_file, key_file)
    try:
        reloader.load()
    except (OSError, BadPair) as e:
        print(f"trainhook-webhook: cannot load --tls-cert/--tls-key: {e}", file=sys.stderr)
        return 2
    keeper = None
    if args.gang_key_secret:
        from kubernetes import client
        if not certs.namespace:
            print("trainhook-webhook: --gang-key-secret needs --namespace (env TRAINHOOK_WEBHOOK_NAMESPACE), the "
                  "Secret's namespace", file=sys.stderr)
            return 2
        try:
            keeper = GangKey(client.CoreV1Api(kube_client()), certs.namespace, args.gang_key_secret,
                             create=args.gang_key_create)
        except Exception as e:  # noqa: BLE001 - the client's loaders raise several unrelated types
            print(f"trainhook-webhook: --gang-key-secret: cannot reach the Kubernetes API: {e}", file=sys.stderr)
            return 2
        args.settings = dataclasses.replace(args.settings, gang_key=await keeper.start())
    app = create_app(args.settings)
    if keeper is not None:
        keep_gang_key(app, keeper)
    watch_certificates(app, reloader, certs.reload_interval, manager, certs.sync_interval)
    if args.launcher_namespaces:
        keep_launcher_configmaps(app, api_client if manager else None, args.launcher_namespaces,
                                 owner=os.environ.get("TRAINHOOK_WEBHOOK_LAUNCHER_OWNER", ""))
    if args.watch_statefulsets:
        try:
            watch_statefulsets(app, api_client if manager else kube_client())
        except Exception as e:  # noqa: BLE001 - the client's loaders raise several unrelated types
            print(f"trainhook-webhook: --watch-statefulsets: cannot reach the Kubernetes API (in-cluster or "
                  f"KUBECONFIG): {e}", file=sys.stderr)
            return 2
    try:
        serve_notary(app, args, reloader.context, api_client if manager else None)
    except Exception as e:  # noqa: BLE001 - no gang key, or the client's loaders' many error types
        print(f"trainhook-webhook: --notary-authority {args.notary_authority}: {e}", file=sys.stderr)
        return 2
    await serve(app, args.host, args.port, reloader.context)
    return 0


async def serve(app: web.Application, host: str, port: int, context: ssl.SSLContext,
                drain_timeout: float = BODY_DEADLINE + 5) -> None:
    """Serve until SIGTERM/SIGINT, then drain: /readyz turns 503 (so the Service stops routing here), reviews
    keep being answered until none is in flight (or the deadline passes), and only then the server stops."""
    runner = app_runner(app)
    await runner.setup()
    accepting, listener = serve_app(runner, host, port, context)
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
    accepting.cancel()
    listener.close()
    await runner.cleanup()
    log.info("stopped", extra={"in_flight": lifecycle.in_flight})


if __name__ == "__main__":
    sys.exit(main())
