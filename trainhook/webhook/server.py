"""`trainhook-webhook`: the process. Its flags, the order it comes up in (the first certificate, the gang key, then
the app with what runs beside it), and serving until SIGTERM with a drain.

`trainhook-webhook --tls-cert FILE --tls-key FILE [--host H] [--port P]` serves a mounted certificate
(certificate modes `secret` and `cert-manager`) and reloads it when the files change;
`trainhook-webhook --cert-mode self-managed --secret-name S --webhook-config-name W --service-name SVC
--namespace NS` keeps its own CA and serving pair in the Secret S and the caBundle of W (webhook/selfcerts.py).

The requests are answered in webhook/handlers.py (the admission app); what runs beside it while it serves (the
certificate reload, the launcher ConfigMaps, the gang key, the StatefulSet watch, the notary's listener) is
webhook/background.py's. This file only decides, from the flags, what runs, and starts it in order.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import logging
import os
import secrets
import signal
import ssl
import sys
from pathlib import Path

from aiohttp import web

from trainhook.webhook.notary import settings as notary_settings
from trainhook.webhook.background import (keep_gang_key, keep_launcher_configmaps, serve_notary, watch_certificates,
                                          watch_statefulsets)
from trainhook.webhook.serving import app_runner, serve_app, stop_app
from trainhook.webhook.notary.gang_key import GangKey
from trainhook.webhook.handlers import BODY_DEADLINE, LIFECYCLE, create_app
from trainhook.webhook.observability import configure_logging
from trainhook.webhook.selfcerts import SelfManagedCerts, kube_client, service_hostnames
from trainhook.webhook.settings import (CERT_ENV, CERT_MODES, CertSettings, Settings, cert_settings_from_env,
                                        parse_namespaces, parse_sans, parse_tolerations, settings_from_env)
from trainhook.webhook.tlsreload import BadPair, CertReloader, server_context
from trainhook.webhook.admission.resources import parse_wait_resources
from trainhook.webhook.admission.tolerations import parse_namespaces as parse_toleration_namespaces

log = logging.getLogger("trainhook.webhook")


def tls_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """TLS 1.2 or newer only, as the API server's webhook client and current guidance expect."""
    context = server_context()
    context.load_cert_chain(cert_file, key_file)
    return context


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
                             "(env TRAINHOOK_WEBHOOK_TOLERATIONS; webhook/admission/tolerations.py)")
    parser.add_argument("--toleration-namespaces", default=None,
                        help="comma-separated namespaces whose training pods get --tolerations, '*' for every one; "
                             "none: no pod gets them (env TRAINHOOK_WEBHOOK_TOLERATION_NAMESPACES)")
    parser.add_argument("--cluster-domain", default=defaults.cluster_domain,
                        help="the cluster's DNS domain (env TRAINHOOK_WEBHOOK_CLUSTER_DOMAIN)")
    parser.add_argument("--gang-wait-resources", default=None,
                        help="JSON {requests, limits} of the gang-wait init container instead of the defaults "
                             "(env TRAINHOOK_WEBHOOK_GANG_WAIT_RESOURCES; webhook/admission/resources.py)")
    parser.add_argument("--wait-timeout", type=int, default=defaults.wait_timeout,
                        help="seconds the gang wait gives peers (env TRAINHOOK_WEBHOOK_WAIT_TIMEOUT)")
    parser.add_argument("--controller-users", default=",".join(defaults.controller_users),
                        help="comma-separated users besides kube-controller-manager's own that may create a "
                             "StatefulSet's or Job's gang pods (env TRAINHOOK_WEBHOOK_CONTROLLER_USERS; "
                             "webhook/admission/provenance.py)")
    parser.add_argument("--gang-key-file", default=None,
                        help="file holding the key gang tokens are derived from; every replica must share it "
                             "(env TRAINHOOK_WEBHOOK_GANG_KEY holds the key itself; the chart keeps it in a Secret)")
    parser.add_argument("--gang-key-secret", default=os.environ.get("TRAINHOOK_WEBHOOK_GANG_KEY_SECRET", ""),
                        help="the Secret (in --namespace) holding the gang key: read before serving, created once "
                             "when missing, looked at again every 30 s (webhook/notary/gang_key.py; env "
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
    notary_settings.add_arguments(parser)
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
        wait_resources = (parse_wait_resources(args.gang_wait_resources) if args.gang_wait_resources is not None
                          else defaults.wait_resources)
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
                             wait_resources=wait_resources,
                             gang_key=gang_key, controller_users=tuple(
                                 u.strip() for u in args.controller_users.split(",") if u.strip()))
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
    problem = notary_settings.check_arguments(args)
    if problem:
        parser.error(problem)
    args.settings = notary_settings.notary_settings(args.settings, args)
    return args


# The cyclic garbage collector's thresholds (Python's are 700, 10, 10). The youngest generation is collected when
# its allocations outnumber its deallocations by the first: at 700, every ~16 credential calls of a gang's start
# (counted at 10,000 members), each time promoting what the calls in flight (up to 1,024 connections) still held,
# to be walked again by the older generations' collections. Measured: docs/develop/performance.md.
GC_THRESHOLDS = (10_000, 10, 10)


def tune_garbage_collector() -> None:
    """What startup made (modules, classes, functions: ~70,000 objects) lives as long as the process: `freeze` keeps
    every later collection from walking it again; then fewer, larger young collections (GC_THRESHOLDS)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


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
    tune_garbage_collector()
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
    await stop_app(runner, accepting, listener)
    log.info("stopped", extra={"in_flight": lifecycle.in_flight})


if __name__ == "__main__":
    sys.exit(main())
