"""A stand-in for the API server's pod and exec endpoints, for the launcher's standard-library client (launcher/
kube_api.py) where the real API server cannot answer: the test control plane has no kubelet, so its exec API
only ever refuses (tests/cluster/test_mpi_kubexec_cluster.py covers that). The websocket side is aiohttp's, an
implementation independent of ours, over real TLS; the exec semantics are the API server's as documented in
k8s.io/apimachinery/pkg/util/httpstream/wsstream (channel byte first; v4 sends the exit Status on channel 3 and
cannot close stdin; v5 closes it with the message [255, 0]).

`ExecServer(directory, host)` serves, as the ServiceAccount `token` it writes (with `ca.crt` and `namespace`)
into `directory`:
- GET  /api/v1/namespaces/NS/pods/POD: a pod (`w-0`, container `mpi`, Running on node-1); 404 Status otherwise;
- GET  /api/v1/namespaces/NS/pods/POD/exec: `w-0` upgrades and runs a tiny "shell": it reads stdin until it
  ends (v5) or a line ends (v4), then writes stdin upper-cased to stdout, a line and EXEC_STDOUT_TAIL to stdout,
  `warning` to stderr, and exits with the code in the command's last word (`sh -c 'exit 3'` -> 3);
  `pending` refuses with the API server's 400 Status.
`.requests` keeps every exec request's query, protocol and Authorization header.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import re
import threading
from pathlib import Path

from aiohttp import WSMsgType, web

from trainhook.certs.build import build_ca, build_serving_pair

TOKEN = "sa-token-1"
EXEC_STDOUT_TAIL = b"x" * 70000  # longer than 65535: the 64-bit length form of a frame
V4, V5 = "v4.channel.k8s.io", "v5.channel.k8s.io"


def status(code: int, message: str, reason: str) -> web.Response:
    return web.json_response({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                              "message": message, "reason": reason, "code": code}, status=code)


class ExecServer:
    def __init__(self, directory: Path, host: str = "127.0.0.1", protocols: tuple[str, ...] = (V5, V4)):
        self.host, self.protocols, self.requests = host, protocols, []
        now = dt.datetime.now(dt.timezone.utc)
        ca = build_ca("exec-double", now)
        pair = build_serving_pair(ca, [host], now)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "ca.crt").write_bytes(ca.cert_pem)
        (directory / "token").write_text(TOKEN)
        (directory / "namespace").write_text("team-a")
        (directory / "tls.crt").write_bytes(pair.cert_pem)
        (directory / "tls.key").write_bytes(pair.key_pem)
        self.directory = directory
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()
        if not self.ready.wait(30):
            raise TimeoutError("the exec double did not start")

    @property
    def env(self) -> dict[str, str]:
        return {"KUBERNETES_SERVICE_HOST": self.host, "KUBERNETES_SERVICE_PORT": str(self.port),
                "TRAINHOOK_SERVICE_ACCOUNT_DIR": str(self.directory)}

    def _serve(self) -> None:
        import ssl
        asyncio.set_event_loop(self.loop)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(str(self.directory / "tls.crt"), str(self.directory / "tls.key"))
        app = web.Application()
        app.router.add_get("/api/v1/namespaces/{ns}/pods/{pod}", self.pod)
        app.router.add_get("/api/v1/namespaces/{ns}/pods/{pod}/exec", self.exec)
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, self.host, 0, ssl_context=context)
        self.loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]
        self.ready.set()
        self.loop.run_forever()

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)

    async def pod(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return status(401, "Unauthorized", "Unauthorized")
        name = request.match_info["pod"]
        if name not in ("w-0", "pending"):
            return status(404, f'pods "{name}" not found', "NotFound")
        running = name == "w-0"
        return web.json_response({
            "metadata": {"name": name, "namespace": request.match_info["ns"], "annotations": {}},
            "spec": {"containers": [{"name": "mpi"}], **({"nodeName": "node-1"} if running else {})},
            "status": {"phase": "Running" if running else "Pending"}})

    async def exec(self, request: web.Request) -> web.StreamResponse:
        self.requests.append({"query": list(request.query.items()), "authorization": request.headers.get(
            "Authorization"), "protocols": request.headers.get("Sec-WebSocket-Protocol")})
        if request.match_info["pod"] != "w-0":
            return status(400, f"pod {request.match_info['pod']} does not have a host assigned", "BadRequest")
        ws = web.WebSocketResponse(protocols=self.protocols)
        await ws.prepare(request)
        for channel in (1, 2, 3):  # the API server opens each channel with an empty message
            await ws.send_bytes(bytes([channel]))
        stdin = b""
        async for message in ws:
            if message.type != WSMsgType.BINARY:
                continue
            if message.data == bytes([255, 0]):  # v5: stdin is closed
                break
            if message.data[:1] == b"\x00":
                stdin += message.data[1:]
                if ws.ws_protocol == V4 and stdin.endswith(b"\n"):
                    break
        await ws.send_bytes(b"\x01" + stdin.upper() + b"done\n" + EXEC_STDOUT_TAIL)
        await ws.send_bytes(b"\x02warning\n")
        command = request.query.getall("command")
        code = int((re.findall(r"\d+", command[-1]) or ["0"])[-1])
        exit_status = {"metadata": {}, "status": "Success"} if code == 0 else {
            "metadata": {}, "status": "Failure", "reason": "NonZeroExitCode",
            "message": f"command terminated with non-zero exit code: exit code {code}",
            "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]}}
        await ws.send_bytes(b"\x03" + json.dumps(exit_status).encode())
        await ws.close()
        return ws
