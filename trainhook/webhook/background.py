"""What runs beside the admission app while it serves, each an aiohttp cleanup context that starts with the app and
stops with it: the certificate reload (and the self-managed sync), the launcher ConfigMaps, the gang key's Secret,
the StatefulSet watch, and the notary's own HTTPS listener; each adds its readiness check where it has one.

Apart from server.py, which decides from the flags which of these run (and in what order the process comes up),
and from handlers.py, which answers the requests: these are the app's long-lived companions.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import ssl

from aiohttp import web

from trainhook.webhook import launcher_configmap
from trainhook.webhook.notary import routes as notary_routes, service as notary
from trainhook.webhook.notary import settings as notary_settings
from trainhook.webhook.serving import app_runner, guard_app, serve_app, stop_app
from trainhook.webhook.notary.gang_key import GangKey
from trainhook.webhook.handlers import LIFECYCLE, METRICS, SETTINGS, WORKLOADS
from trainhook.webhook.notary.metrics import NotaryMetrics
from trainhook.webhook.notary.sweep import Sweep
from trainhook.webhook.selfcerts import SelfManagedCerts, kube_client
from trainhook.webhook.statefulset_cache import StatefulSetCache, start_background
from trainhook.webhook.tlsreload import CertReloader

log = logging.getLogger("trainhook.webhook")


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
    (webhook/notary/gang_key.py: the Secret is the truth, so replicas converge within one interval)."""
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
    """The notary (webhook/notary/routes.py over service.py): a second HTTPS listener on --notary-port with the
    webhook's own TLS context, up and down with `app`; only with --notary-authority cluster or local:DIR."""
    if args.notary_authority == "none":
        return
    authority = notary_settings.authority_from(args, api_client)
    the_notary = notary.Notary(authority, lambda: app[SETTINGS].settings.gang_key,
                               metrics=NotaryMetrics(app[METRICS].registry))
    notary_app = notary_routes.create_app(the_notary)
    sweep = None  # gangs whose coordinator is gone, recorded by the notary (webhook/notary/sweep.py): a cluster's
    if getattr(args, "notary_sweep_interval", 0) > 0 and hasattr(authority, "list_unrecorded_jobs"):
        namespaces = tuple(n.strip() for n in getattr(args, "notary_namespaces", "").split(",") if n.strip())
        sweep = Sweep(the_notary, authority, namespaces, args.notary_sweep_interval)  # type: ignore[arg-type]
    # Every pod may reach this port (the chart's NetworkPolicy opens it to all): the same connection cap, head
    # deadline and head bounds as the admission port (connections.py), not a bare TCPSite that idle clients fill.
    guard_app(notary_app)

    async def listener(app: web.Application):
        runner = app_runner(notary_app)
        await runner.setup()
        accepting, sock = serve_app(runner, args.host, args.notary_port, context)
        log.info("notary serving", extra={"host": args.host, "port": args.notary_port, "url": args.notary_url})
        sweeping = asyncio.create_task(sweep.run()) if sweep is not None else None
        yield
        if sweeping is not None:
            sweeping.cancel()
            await asyncio.gather(sweeping, return_exceptions=True)
        await stop_app(runner, accepting, sock)

    app.cleanup_ctx.append(listener)
