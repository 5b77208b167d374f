"""The notary port's connection bounds (webhook/connections.py `Limits`, issue 32): a gang's burst is not
livelocked, and one source's flood still evicts only its own connections.

A real guarded listener on loopback (the guard's accept loop, asyncio's TLS), with small bounds so the test is
quick; clients are raw TCP connections that say nothing (a member whose ClientHello is queued behind a burst looks
the same to the guard), each from a loopback address of its own (127/8 routes to lo) as each pod has its own. The
hostile clients' guarantees with the chart's bounds are tests/webhook/test_notary_hostile_clients.py's.
"""

from __future__ import annotations

import asyncio
import gc
import socket
import ssl
from pathlib import Path

import pytest
from aiohttp import web

from trainhook.certs.build import write_bundle
from trainhook.webhook import connections
from trainhook.webhook.connections import Limits
from trainhook.webhook.serving import GUARD, LIMITS, app_runner, awaiting_body, guard_app, serve_app


@pytest.fixture(scope="module")
def context(tmp_path_factory) -> ssl.SSLContext:
    certs: Path = tmp_path_factory.mktemp("certs")
    write_bundle(certs, ["127.0.0.1", "localhost"])
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(certs / "tls.crt", certs / "tls.key")
    return server


def closed(sock: socket.socket) -> bool:
    """Whether the server closed (or reset) this client's connection."""
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


async def read_body(request: web.Request) -> web.Response:
    """What the notary and admission handlers do with a body that did not come with its head."""
    with awaiting_body(request):
        await request.read()
    return web.Response(text="ok")


async def guarded(context: ssl.SSLContext, limits: Limits | None):
    app = web.Application()
    app.router.add_post("/body", read_body)
    if limits is not None:
        app[LIMITS] = limits
    guard_app(app)
    runner = app_runner(app)
    await runner.setup()
    task, listener = serve_app(runner, "127.0.0.1", 0, context)
    return app[GUARD], runner, task, listener


def connect(port: int, source: str) -> socket.socket:
    sock = socket.socket()
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    return sock


def run(context, limits, scenario):
    async def main():
        guard, runner, task, listener = await guarded(context, limits)
        clients: list[socket.socket] = []
        try:
            await scenario(guard, listener.getsockname()[1], clients)
        finally:
            task.cancel()
            listener.close()
            for sock in clients:
                sock.close()
            await runner.cleanup()
    asyncio.run(main())


async def closed_soon(sock: socket.socket, within: float = 2.0) -> bool:
    """Whether the server closes this client's connection within `within` seconds: the guard runs on this same
    loop, so on a loaded machine its accept may come after one settle() (a CI run's failure)."""
    end = asyncio.get_running_loop().time() + within
    while not closed(sock):
        if asyncio.get_running_loop().time() > end:
            return False
        await asyncio.sleep(0.05)
    return True


async def settle() -> None:
    """Let the guard accept; an evicted connection whose handshake task never ran is closed when a collection
    frees that task (in a busy server, within milliseconds)."""
    await asyncio.sleep(0.2)
    gc.collect()
    await asyncio.sleep(0.05)


def test_a_burst_past_the_total_closes_the_new_connection_not_a_young_pending_one(context):
    """Issue 32: every member of a gang connecting at once. Past the total, a pending connection younger than the
    grace is not evicted: the new one is closed at once (its launcher retries). Once the grace has passed, the
    oldest pending one is evicted again (a member cannot hold its place forever)."""
    limits = Limits(max_connections=8, per_source=4, pending_grace=1.0, backlog=64, crowded=3)

    async def scenario(guard, port, clients):
        for n in range(8):
            clients.append(connect(port, f"127.0.1.{n + 1}"))
        await settle()
        assert len(guard.open) == 8
        late = connect(port, "127.0.1.100")
        clients.append(late)
        await settle()
        assert await closed_soon(late), "the connection past the total should have been closed at once"
        assert not any(closed(s) for s in clients[:8]), "a young pending connection was evicted"
        await asyncio.sleep(1.0)  # past the grace
        later = connect(port, "127.0.1.101")
        clients.append(later)
        await settle()
        assert await closed_soon(clients[0]), "past the grace, the oldest pending connection is evicted"
        assert not closed(later) and not any(closed(s) for s in clients[1:8])
    run(context, limits, scenario)


def test_past_the_total_a_crowded_source_has_no_grace(context):
    """Sources holding `crowded` connections or more (a flood from a few pods, each within its share) lose their
    oldest pending connection at once when the total is reached, young or not; one-connection sources keep theirs."""
    limits = Limits(max_connections=8, per_source=4, pending_grace=5.0, backlog=64, crowded=3)

    async def scenario(guard, port, clients):
        members = [connect(port, f"127.0.5.{n + 1}") for n in range(2)]
        flood = [connect(port, f"127.0.6.{n // 3 + 1}") for n in range(6)]
        clients.extend(members + flood)
        await settle()
        assert len(guard.open) == 8
        late = connect(port, "127.0.5.100")
        clients.append(late)
        await settle()
        assert not closed(late) and not any(closed(s) for s in members)
        assert [closed(s) for s in flood] == [True, False, False, False, False, False]
    run(context, limits, scenario)


def test_one_source_past_its_share_evicts_its_own_oldest_at_once(context):
    """A flood from one address (a pod) meets its own share first and evicts its own oldest connection, whatever
    its age; the other sources' connections are untouched, and the total is never reached."""
    limits = Limits(max_connections=16, per_source=4, pending_grace=5.0, backlog=64)

    async def scenario(guard, port, clients):
        members = [connect(port, f"127.0.2.{n + 1}") for n in range(3)]
        flood = [connect(port, "127.0.3.1") for _ in range(10)]
        clients.extend(members + flood)
        await settle()
        assert not any(closed(s) for s in members)
        assert [closed(s) for s in flood] == [True] * 6 + [False] * 4
        assert len(guard.sources["127.0.3.1"]) == 4 and len(guard.open) == 7
    run(context, limits, scenario)


def test_the_admission_port_keeps_evicting_the_oldest_pending_at_once(context):
    """Without the notary's limits (the admission port): one total, no grace, so one more connection evicts the
    oldest pending one at once, as before issue 32."""
    limits = None

    async def scenario(guard, port, clients):
        guard.max_connections = guard.per_source = 4
        for n in range(5):
            clients.append(connect(port, f"127.0.4.{n + 1}"))
        await settle()
        assert [closed(s) for s in clients] == [True, False, False, False, False]
    run(context, limits, scenario)


def test_the_notary_limits_fit_a_gang_burst_and_a_source_keeps_its_share():
    assert connections.NOTARY.max_connections >= 1024
    assert connections.NOTARY.per_source == connections.MAX_CONNECTIONS
    assert 0 < connections.NOTARY.pending_grace < connections.HEAD_DEADLINE and connections.NOTARY.crowded > 1
    assert connections.NOTARY.backlog >= connections.NOTARY.max_connections
    assert Limits().pending_grace == 0 and Limits().per_source == Limits().max_connections == connections.MAX_CONNECTIONS


def test_a_source_at_its_share_whose_bodies_stall_loses_the_longest_stalled_one(context):
    """Issue 31 item 3: a connection whose request head came but whose body does not (a member gone rogue, or a
    flood that finishes its heads) is evicted when its source needs room, the longest-stalled first, and the new
    connection is served. (tests/webhook/
    test_notary_hostile_clients.py floods with two such streams from one source at once, where the source's own
    pending handshakes go first; this shows the stalled bodies' turn on its own.)"""
    limits = Limits(max_connections=16, per_source=4, pending_grace=5.0, backlog=64)
    client = ssl.create_default_context()
    client.check_hostname, client.verify_mode = False, ssl.CERT_NONE
    head = b"POST /body HTTP/1.1\r\nHost: x\r\nContent-Length: 60000\r\n\r\n"

    async def stalled_head(port: int):
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client, server_hostname="localhost",
                                                       local_addr=("127.0.7.1", 0))
        writer.write(head)
        await writer.drain()
        return reader, writer

    async def ended(reader: asyncio.StreamReader) -> bool:
        try:
            return await asyncio.wait_for(reader.read(1), 0.5) == b""
        except asyncio.TimeoutError:
            return False
        except (ConnectionError, ssl.SSLError):
            return True

    async def scenario(guard, port, clients):
        stalled = [await stalled_head(port) for _ in range(4)]
        await asyncio.sleep(0.2)
        assert len(guard.waiting) == 4, "every head was read and its handler waits for the body"
        await asyncio.sleep(connections.BODY_STALL)  # all four have stalled past BODY_STALL now
        newer = await stalled_head(port)
        await settle()
        assert [await ended(reader) for reader, _ in stalled] == [True, False, False, False]
        assert not await ended(newer[0])
        assert len(guard.sources["127.0.7.1"]) == 4
        for _, writer in [*stalled, newer]:
            writer.close()
    run(context, limits, scenario)

