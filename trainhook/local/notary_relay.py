"""The pods' way to the notary under `trainhook local`: a byte relay from the pod network to the webhook process.

Pods live in network namespaces that reach nothing outside the run (trainhook/local/network.py); the webhook
process that serves the notary listens on the host's 127.0.0.1. The runner, which holds both, listens on the
switch's bridge address (`Network.listen_on_switch`, port 8444) and copies bytes both ways to the notary's
127.0.0.1 port. It does not terminate TLS: a pod's launcher verifies the notary's own certificate (which names
`trainhook-notary`, the name every pod's hosts file gives the bridge address) against TRAINHOOK_NOTARY_CA, and
the notary sees the pod's token and decides exactly as it would in a cluster. The relay is the Service's part.

Bounded as the notary's own listener is: at most MAX_CONNECTIONS at once (more are closed at accept), and a
connection idle for IDLE_SECONDS in both directions is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading

MAX_CONNECTIONS = 256
IDLE_SECONDS = 120.0
_CHUNK = 65536


class NotaryRelay:
    """Relays connections accepted on `listener` (a listening socket, any namespace) to 127.0.0.1:`port`, in a
    thread of its own with its own event loop (the runner's loop belongs to the supervisor)."""

    def __init__(self, listener: socket.socket, port: int, host: str = "127.0.0.1"):
        self.listener, self.port, self.host = listener, port, host
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._serve, name="notary-relay", daemon=True)
        self.started = threading.Event()
        self.connections = 0
        self.relayed = 0  # connections relayed so far (for tests and the log)
        self.server: asyncio.AbstractServer | None = None

    def __enter__(self) -> NotaryRelay:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        self.thread.start()
        self.started.wait(10)

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)

        async def begin() -> None:
            self.server = await asyncio.start_server(self._relay, sock=self.listener)
            self.started.set()

        self.loop.run_until_complete(begin())
        self.loop.run_forever()
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.connections >= MAX_CONNECTIONS:
            writer.close()
            return
        self.connections += 1
        self.relayed += 1
        try:
            try:
                up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(self.host, self.port), 10)
            except (OSError, asyncio.TimeoutError):
                return
            try:
                await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
            finally:
                up_writer.close()
        finally:
            self.connections -= 1
            writer.close()

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await asyncio.wait_for(reader.read(_CHUNK), IDLE_SECONDS):
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.TimeoutError):
            pass
        finally:
            with contextlib.suppress(OSError, RuntimeError):
                if writer.can_write_eof():
                    writer.write_eof()

    def close(self) -> None:
        """Stop accepting, drop the open connections, end the thread; safe to call twice."""
        if not self.thread.is_alive():
            self.listener.close()
            return

        async def stop() -> None:
            if self.server is not None:
                self.server.close()
            tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)  # their own cleanup, while the loop runs

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.listener.close()
