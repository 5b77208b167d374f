"""An aiohttp app served through a ConnectionGuard (webhook/connections.py): the glue between the guard's accept
loop and aiohttp's per-connection protocol, the app keys that let handlers reach the guard, and the shared body
budget. Both ports use it: admission (handlers.py) and the notary (notary/routes.py), each with its own guard.

Kept apart from the guard so that connections.py holds only what bounds connections (the accept loop, the
deadlines, eviction), and aiohttp is named here and in the guard's one middleware.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl

from aiohttp import web

from trainhook.webhook.connections import (BODY_BUDGET, IDLE_TIMEOUT, MAX_FIELD_SIZE, MAX_HEADERS, ConnectionGuard,
                                           Limits)


class BodyBudget:
    """Bytes of bodies being read now, over all connections; a request that would pass the budget is answered
    503 at once instead of holding memory (the API server retries a failed call on its next one)."""

    def __init__(self, limit: int = BODY_BUDGET) -> None:
        self.limit, self.used = limit, 0

    def take(self, size: int) -> bool:
        if self.used + size > self.limit:
            return False
        self.used += size
        return True

    def give(self, size: int) -> None:
        self.used -= size


GUARD = web.AppKey("connection_guard", ConnectionGuard)
BUDGET = web.AppKey("body_budget", BodyBudget)


def awaiting_body(request: web.Request):
    """The guard's `awaiting_body` for `request`'s connection (a no-op for an app served without a guard)."""
    guard = request.app.get(GUARD)
    return guard.awaiting_body(request.transport) if guard is not None else contextlib.nullcontext()


LIMITS = web.AppKey("connection_limits", Limits)


def guard_app(app: web.Application) -> None:
    """Give `app` its ConnectionGuard (whose middleware sees each request head arrive), bounded by the app's
    LIMITS when it names them (the notary's) and its BodyBudget."""
    app[GUARD] = ConnectionGuard(limits=app.get(LIMITS))
    app[BUDGET] = BodyBudget()
    app.middlewares.append(app[GUARD].middleware())


def app_runner(app: web.Application) -> web.AppRunner:
    """The runner of a guarded `app`: aiohttp's per-connection protocol made with our head bounds and keep-alive
    (no access log, no signal handlers of its own); set it up, then serve_app."""
    return web.AppRunner(app, handle_signals=False, access_log=None, keepalive_timeout=IDLE_TIMEOUT,
                         max_headers=MAX_HEADERS, max_field_size=MAX_FIELD_SIZE, max_line_size=MAX_FIELD_SIZE)


def listen(host: str, port: int, backlog: int = 128) -> socket.socket:
    """The listening socket (IPv4 or IPv6 from `host`), SO_REUSEADDR as aiohttp's sites set it."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    return socket.create_server((host, port), family=family, backlog=backlog)


def serve_app(runner: web.AppRunner, host: str, port: int,
              context: ssl.SSLContext) -> tuple[asyncio.Task, socket.socket]:
    """Serve `runner` (set up) on host:port through its app's ConnectionGuard; cancel the task and close the
    socket to stop accepting."""
    guard = runner.app[GUARD]
    context.num_tickets = 0  # no client resumes a session (the module docstring): a ticket is work thrown away
    guard.protocol_factory, guard.context = runner.server, context
    listener = listen(host, port, guard.limits.backlog)
    return asyncio.create_task(guard.serve(listener)), listener


async def stop_app(runner: web.AppRunner, accepting: asyncio.Task, listener: socket.socket) -> None:
    """Undo serve_app: stop accepting, close the socket and the app's connections, then log the refusals the
    guard counted since its last line (lost with the process otherwise)."""
    accepting.cancel()
    listener.close()
    await runner.cleanup()
    runner.app[GUARD].refusals.flush()
