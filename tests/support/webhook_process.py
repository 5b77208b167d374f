"""The real webhook server, started as its console script, for the tests that talk HTTPS to it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import requests

from trainhook.certs.build import write_bundle


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
