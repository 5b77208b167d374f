"""The webhook process runs on uvloop (webhook/server.py `event_loop`), and the connection guard
(webhook/connections.py) bounds its connections there as it does on asyncio's loop.

uvloop's transports and TLS layer are its own (compiled), not asyncio's: the guard's accept loop, its handshake
task (cancelled to evict a pending connection), its per-source bounds and the transport it finds a request's
connection by must all still hold. The guard's own tests (test_notary_connections.py) are run here again, unchanged,
on uvloop; the real process's hostile-client tests run on uvloop already, since it is the process's default.
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import socket
import ssl
import subprocess
import sys
from pathlib import Path

import pytest
import uvloop
from aiohttp import web

from trainhook.certs.build import write_bundle
from trainhook.webhook import connections
from trainhook.webhook.connections import app_runner, guard_app, serve_app
from webhook_process import start_webhook


def _guard_tests():
    """test_notary_connections.py, loaded by path under a name of its own (a test module is not importable by
    name when several rooms are collected)."""
    path = Path(__file__).with_name("test_notary_connections.py")
    spec = importlib.util.spec_from_file_location("guard_tests_on_uvloop", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GUARD_TESTS = _guard_tests()
SCENARIOS = [name for name, test in vars(GUARD_TESTS).items()
             if name.startswith("test_") and "context" in inspect.signature(test).parameters]


@pytest.fixture(scope="module")
def context(tmp_path_factory) -> ssl.SSLContext:
    certs: Path = tmp_path_factory.mktemp("certs")
    write_bundle(certs, ["127.0.0.1", "localhost"])
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(certs / "tls.crt", certs / "tls.key")
    server.num_tickets = 0
    return server


@pytest.fixture
def on_uvloop():
    """asyncio.run makes uvloop's loops while the test runs."""
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    try:
        loop = asyncio.new_event_loop()
        assert isinstance(loop, uvloop.Loop)
        loop.close()
        yield
    finally:
        asyncio.set_event_loop_policy(None)


def test_the_guard_scenarios_are_all_run_here():
    assert len(SCENARIOS) >= 4, SCENARIOS


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_connection_guard_bounds_connections_on_uvloop_as_on_asyncio(scenario, context, on_uvloop):
    getattr(GUARD_TESTS, scenario)(context)


def test_on_uvloop_a_request_finds_its_connection_and_a_silent_one_is_closed_at_its_deadline(context, on_uvloop):
    """The guard keys connections by the transport aiohttp's request carries (uvloop's TLS transport), counts the
    request's head and then the connection as idle; a connection that never starts its handshake is closed when
    the head deadline passes."""
    seen: list[connections.Connection | None] = []

    async def hello(request: web.Request) -> web.Response:
        seen.append(request.app[connections.GUARD].by_transport.get(request.transport))
        return web.json_response({"ok": True})

    async def main():
        app = web.Application()
        app.router.add_get("/", hello)
        guard_app(app)
        guard = app[connections.GUARD]
        guard.head_deadline = 0.5
        runner = app_runner(app)
        await runner.setup()
        task, listener = serve_app(runner, "127.0.0.1", 0, context)
        port = listener.getsockname()[1]
        try:
            client = ssl.create_default_context()
            client.check_hostname, client.verify_mode = False, ssl.CERT_NONE
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client)
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await reader.readline()).startswith(b"HTTP/1.1 200")
            await asyncio.sleep(0.1)
            [conn] = guard.open
            assert seen == [conn] and conn.heads == 1 and conn.active == 0 and conn in guard.idle
            silent = socket.create_connection(("127.0.0.1", port))
            await asyncio.sleep(0.2)
            assert len(guard.open) == 2
            await asyncio.sleep(0.6)  # past the head deadline
            assert list(guard.open) == [conn], "the silent connection should have been closed at its deadline"
            silent.setblocking(False)
            try:
                assert silent.recv(1) == b""
            except ConnectionResetError:
                pass
            silent.close()
            writer.close()
        finally:
            task.cancel()
            listener.close()
            await runner.cleanup()
    asyncio.run(main())


def test_the_process_serves_on_uvloop_and_on_asyncio_when_asked(tmp_path):
    hook = start_webhook(tmp_path / "uvloop")
    try:
        assert '"event_loop": "uvloop"' in hook.log_file.read_text()
    finally:
        hook.stop()
    hook = start_webhook(tmp_path / "asyncio", env={"TRAINHOOK_WEBHOOK_EVENT_LOOP": "asyncio"})
    try:
        assert '"event_loop": "asyncio"' in hook.log_file.read_text()
    finally:
        hook.stop()


def test_an_unknown_event_loop_is_refused_at_start():
    script = Path(sys.executable).parent / "trainhook-webhook"
    done = subprocess.run([str(script), "--tls-cert", "x", "--tls-key", "y"], capture_output=True, text=True,
                          env={"TRAINHOOK_WEBHOOK_EVENT_LOOP": "trio", "PATH": "/usr/bin:/bin"}, timeout=60)
    assert done.returncode == 2 and "TRAINHOOK_WEBHOOK_EVENT_LOOP='trio'" in done.stderr
