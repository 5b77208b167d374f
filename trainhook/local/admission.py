"""The apiserver's side of admission: the real webhook server as a subprocess, and the review client.

`WebhookServer` runs `trainhook-webhook` on 127.0.0.1 with a fresh CA and serving certificate, and waits for
/healthz. `AdmissionClient.admit` sends a CREATE AdmissionReview (admission.k8s.io/v1) built as kube-apiserver
builds it, checks the answer as the apiserver does (uid, allowed, patchType) and applies the JSON patch.

With `notary_dir` (the run directory), the same process serves the notary (webhook/notary/service.py) with the local
authority over that directory's files (webhook/notary/local.py) on another 127.0.0.1 port, and injects
`https://trainhook-notary:8444` into gang pods: the name every pod's hosts file gives the runner's relay on the
pod network (trainhook/local/notary_relay.py), which the serving certificate carries as a SAN.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import secrets
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import jsonpatch

from trainhook.certs.build import CA_FILE, CERT_FILE, KEY_FILE, write_bundle
from trainhook.launcher.files import write_atomically
from trainhook.local.manifest import describe, type_of

API_VERSION = "admission.k8s.io/v1"
# (apiVersion, kind) -> (group, version, resource), as the apiserver names what is being created.
RESOURCES = {
    ("v1", "Pod"): ("", "v1", "pods"),
    ("v1", "Service"): ("", "v1", "services"),
    ("apps/v1", "StatefulSet"): ("apps", "v1", "statefulsets"),
    ("batch/v1", "Job"): ("batch", "v1", "jobs"),
}


class AdmissionError(Exception):
    """Admission did not allow the object; the message is what kubectl would print."""


class Denied(AdmissionError):
    """The webhook answered `allowed: false`."""


def build_review(obj: dict, user: dict, uid: str | None = None) -> dict:
    """A CREATE AdmissionReview for `obj`, field for field as kube-apiserver sends it to a mutating webhook.
    (A pod created through generateName has no name yet: the apiserver names it after admission.)"""
    api_version, kind = type_of(obj)
    group, version, resource = RESOURCES[(api_version, kind)]
    meta = obj.get("metadata") or {}
    request: dict = {
        "uid": uid or str(uuid.uuid4()),
        "kind": {"group": group, "version": version, "kind": kind},
        "resource": {"group": group, "version": version, "resource": resource},
        "requestKind": {"group": group, "version": version, "kind": kind},
        "requestResource": {"group": group, "version": version, "resource": resource},
        "namespace": meta.get("namespace", ""),
        "operation": "CREATE",
        "userInfo": copy.deepcopy(user),
        "object": copy.deepcopy(obj),
        "oldObject": None,
        "dryRun": False,
        "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
    }
    if meta.get("name"):
        request["name"] = meta["name"]
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "request": request}


@dataclass
class Admitted:
    obj: dict
    warnings: list[str] = field(default_factory=list)
    patched: bool = False


def apply_response(obj: dict, review: dict, answer: object, source: str = "") -> Admitted:
    """Check a webhook's answer as the apiserver does and apply its patch; raises AdmissionError/Denied."""
    what = f'error when creating "{source}": ' if source else ""
    if not isinstance(answer, dict) or answer.get("apiVersion") != API_VERSION \
            or answer.get("kind") != "AdmissionReview" or not isinstance(answer.get("response"), dict):
        raise AdmissionError(f"Internal error occurred: {what}the webhook's answer is not an {API_VERSION} "
                             "AdmissionReview")
    response = answer["response"]
    if response.get("uid") != review["request"]["uid"]:
        raise AdmissionError(f"Internal error occurred: {what}expected response.uid="
                             f"{review['request']['uid']!r}, got {response.get('uid')!r}")
    warnings = [str(w) for w in response.get("warnings") or []]
    if response.get("allowed") is not True:
        status = response.get("status") or {}
        message = status.get("message") or "the request was denied"
        raise Denied(f"Error from server ({status.get('reason', 'Forbidden')}): {what}admission webhook "
                     f"denied the request: {message}")
    if not response.get("patch"):
        return Admitted(copy.deepcopy(obj), warnings)
    if response.get("patchType") != "JSONPatch":
        raise AdmissionError(f"Internal error occurred: {what}unsupported patchType {response.get('patchType')!r}")
    try:
        patch = json.loads(base64.b64decode(response["patch"]))
        patched = jsonpatch.apply_patch(obj, patch)
    except (ValueError, TypeError, jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as e:
        raise AdmissionError(f"Internal error occurred: {what}the webhook's JSON patch does not apply: {e}") from e
    return Admitted(patched, warnings, patched=True)


class AdmissionClient:
    """Sends reviews to a webhook over HTTPS, trusting only its CA (failurePolicy Fail: errors are refusals)."""

    def __init__(self, url: str, ca_file: Path, timeout: float = 10.0, source: str = ""):
        self.url = url
        self.context = ssl.create_default_context(cafile=str(ca_file))
        self.timeout = timeout
        self.source = source

    def post(self, review: dict) -> object:
        request = urllib.request.Request(self.url, data=json.dumps(review).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, context=self.context, timeout=self.timeout) as reply:
                return json.loads(reply.read())
        except urllib.error.HTTPError as e:
            body = e.read().decode(errors="replace")[:500]
            raise AdmissionError(f"Internal error occurred: failed calling webhook for "
                                 f"{describe(review['request']['object'])}: HTTP {e.code}: {body}") from e
        except (urllib.error.URLError, OSError, json.JSONDecodeError) as e:
            raise AdmissionError(f"Internal error occurred: failed calling webhook: {e}") from e

    def admit(self, obj: dict, user: dict) -> Admitted:
        review = build_review(obj, user)
        return apply_response(obj, review, self.post(review), self.source)


PORT_ATTEMPTS = 3  # WebhookServer.start: ports chosen again when taken between free_port and the server's bind


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def webhook_command() -> list[str]:
    """`trainhook-webhook` of this interpreter's environment (the module when the script is not installed)."""
    script = Path(sys.executable).parent / "trainhook-webhook"
    return [str(script)] if script.exists() else [sys.executable, "-m", "trainhook.webhook.server"]


# The notary's name and port as gang pods dial it under `trainhook local` (each pod's hosts file resolves the name to
# the runner's relay on the pod network; the webhook's certificate carries the name).
NOTARY_HOST, NOTARY_PORT = "trainhook-notary", 8444
NOTARY_URL = f"https://{NOTARY_HOST}:{NOTARY_PORT}"


class WebhookServer:
    """The real webhook, served on 127.0.0.1 for the length of a `with` block. Its output goes to webhook.log.
    With `notary_dir`, it serves the notary too (local authority over that run directory) on `notary_port`, and
    names it `notary_url` in the gang pods it admits (`{port}` in it: the notary's own 127.0.0.1 port, for
    processes that dial it directly: tests/support/gang_notary.py)."""

    def __init__(self, work_dir: Path, env: dict[str, str] | None = None, startup_timeout: float = 30.0,
                 notary_dir: Path | None = None, notary_url: str = NOTARY_URL):
        self.work_dir: Path = work_dir
        self.env = dict(os.environ if env is None else env)
        self.startup_timeout = startup_timeout
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.notary_dir, self.notary_url = notary_dir, notary_url
        self.notary_port = 0

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}/mutate"

    @property
    def ca_file(self) -> Path:
        return self.work_dir / "certs" / CA_FILE

    @property
    def log_file(self) -> Path:
        return self.work_dir / "webhook.log"

    def client(self, source: str = "") -> AdmissionClient:
        return AdmissionClient(self.url, self.ca_file, source=source)

    def __enter__(self) -> WebhookServer:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Start the process; a second start (after stop) serves the same ports with the same certificates, as a
        webhook pod that comes back behind its Service does (tests of an outage). Ports it chose itself are chosen
        again when another process bound one first (free_port only finds a port free at that moment)."""
        chosen = self.proc is None and not self.port and not self.notary_port
        for attempt in range(PORT_ATTEMPTS):
            try:
                return self._start()
            except AdmissionError as e:
                if not chosen or attempt == PORT_ATTEMPTS - 1 or "Address already in use" not in str(e):
                    raise
                self.port = self.notary_port = 0

    def _start(self) -> None:
        certs = self.work_dir / "certs"
        key_file = self.work_dir / "gang.key"  # the run's gang key, as a cluster keeps it in a Secret
        if self.proc is None:  # the first start: fresh certificates and key; a start again keeps both
            write_bundle(certs, ["127.0.0.1", "localhost", NOTARY_HOST])
            write_atomically(key_file, secrets.token_hex(32).encode(), 0o600)
        self.port = self.port or free_port()
        argv = webhook_command() + ["--tls-cert", str(certs / CERT_FILE), "--tls-key", str(certs / KEY_FILE),
                                    "--host", "127.0.0.1", "--port", str(self.port)]
        if self.notary_dir is not None:
            self.notary_port = self.notary_port or free_port()
            argv += ["--notary-authority", f"local:{self.notary_dir.resolve()}", "--notary-port",
                     str(self.notary_port), "--notary-url", self.notary_url.format(port=self.notary_port),
                     "--notary-ca-file", str(certs / CA_FILE)]
            if not self.env.get("TRAINHOOK_WEBHOOK_GANG_KEY"):  # a key given by the caller is kept as it is
                argv += ["--gang-key-file", str(key_file)]
        with open(self.log_file, "wb") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=self.env, start_new_session=True)
        self._wait_healthy()

    def _wait_healthy(self) -> None:
        context = ssl.create_default_context(cafile=str(self.ca_file))
        deadline = time.monotonic() + self.startup_timeout
        last = ""
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise AdmissionError(f"the webhook server exited with {self.proc.returncode} before it was ready:\n"
                                     f"{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"https://127.0.0.1:{self.port}/healthz", context=context,
                                            timeout=2) as reply:
                    if reply.status == 200:
                        return
            except (urllib.error.URLError, OSError) as e:
                last = str(e)
            time.sleep(0.1)
        self.stop()
        raise AdmissionError(f"the webhook server was not healthy after {self.startup_timeout:g}s ({last}):\n"
                             f"{self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
