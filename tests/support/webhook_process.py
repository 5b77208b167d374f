"""The real webhook server, started as its console script, for the tests that talk HTTPS to it."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import requests

from trainhook.certs.build import write_bundle


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A TCP port nobody listens on, for a server the test starts next (which binds every address). Chosen below
    the kernel's ephemeral range: a port the kernel handed out (bind to port 0) is also what it hands any outgoing
    connection of a parallel test, and one such connection made the launcher's later bind fail with `Address already
    in use` (a CI failure)."""
    low = _ephemeral_low()
    for _ in range(200):
        port = random.randrange(10000, low if low > 11000 else 30000)
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free TCP port below the ephemeral range after 200 tries")


@dataclass
class WebhookProcess:
    process: subprocess.Popen
    url: str
    ca_file: Path
    log_file: Path

    def post(self, body: object, raw: bytes | None = None, timeout: float = 10) -> requests.Response:
        data = raw if raw is not None else None
        kwargs = {"data": data} if raw is not None else {"json": body}
        return requests.post(self.url + "/mutate", verify=str(self.ca_file), timeout=timeout, **kwargs)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_webhook(workdir: Path, host: str = "127.0.0.1", extra_args: list[str] | None = None,
                  sans: list[str] | None = None, env: dict | None = None, port: int | None = None) -> WebhookProcess:
    """Start `trainhook-webhook`; a second start in the same `workdir` reuses its certificates (a restart)."""
    certs = workdir / "certs"
    if not (certs / "tls.crt").exists():
        write_bundle(certs, sans or [host, "localhost"])
    port = port or free_port()
    log_file = workdir / "webhook.log"
    command = [os.path.join(os.path.dirname(sys.executable), "trainhook-webhook"),
               "--tls-cert", str(certs / "tls.crt"), "--tls-key", str(certs / "tls.key"),
               "--host", host, "--port", str(port), *(extra_args or [])]
    process = subprocess.Popen(command, stdout=log_file.open("wb"), stderr=subprocess.STDOUT,
                               env={**os.environ, **(env or {})})
    hook = WebhookProcess(process, f"https://{host}:{port}", certs / "ca.crt", log_file)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"trainhook-webhook exited: {log_file.read_text()}")
        try:
            if requests.get(hook.url + "/healthz", verify=str(hook.ca_file), timeout=1).ok:
                return hook
        except requests.RequestException:
            time.sleep(0.1)
    hook.stop()
    raise RuntimeError(f"trainhook-webhook did not become healthy: {log_file.read_text()}")
