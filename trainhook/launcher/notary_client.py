"""The launcher's client of the notary (docs/operate/security.md): the gang's key, its recorded outcome, its Events,
its progress.

A gang pod holds no Kubernetes permission and no secret in its spec or environment. What it has is a projected
ServiceAccount token of audience `trainhook` that the kubelet writes (and refreshes) in keys.IDENTITY_DIR; the
notary (a listener of trainhook's own webhook Deployment) checks that token with a TokenReview, checks the pod
is a member of the gang it claims, and then answers: the gang's signing key to any member, the outcome to the
coordinator (rank 0's launcher), which alone may record it or emit an Event.

So this module:
- reads the token file afresh on every call (the kubelet rotates it; a cached copy would expire);
- talks HTTPS only, verifying the notary's certificate against TRAINHOOK_NOTARY_CA with the hostname checked
  (a pod on the network that answers in the notary's place gets no token and gives no key);
- keeps the key in memory: it is returned to the caller, never written to a file or put into an environment,
  so the training process the launcher starts never sees it.

Standard library only, Python 3.8+ (it runs inside the user's image).
"""

from __future__ import annotations

import http.client
import json
import random
import socket
import ssl
import threading
import time
import urllib.parse
from typing import Callable, Mapping

from trainhook.gang import keys
from trainhook.launcher.policy import IDENTITY_TOKEN_FILE as TOKEN_FILE
from trainhook.launcher.outcome import Outcome
from trainhook.launcher.policy import LaunchSettings
from trainhook.launcher.speak import speaker
from trainhook.gang.keys import TH_IDENTITY_TOKEN

CALL_TIMEOUT = 10.0  # one HTTPS call (connect, TLS, answer); the notary itself waits on the API server
FIRST_DELAY, MAX_DELAY = 0.2, 2.0  # jittered retry delays while the notary cannot answer yet
ANSWER_LIMIT = 1 << 20


say = speaker()


class NotaryError(Exception):
    """The notary could not be asked, or refused: the message names the notary and its answer. `status` is the
    HTTP status (None when no answer came), so callers can tell "not yet" (503, no answer) from "no" (401, 403)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class NotaryClient:
    """One notary endpoint, as injected: its base URL, the CA bundle that signs its certificate, and where this
    pod's identity token is."""

    def __init__(self, url: str, ca_pem: str, token_file: str = TOKEN_FILE, timeout: float = CALL_TIMEOUT):
        parsed = urllib.parse.urlsplit(url.strip())
        if parsed.scheme != "https" or not parsed.hostname:
            raise NotaryError(f"{keys.TH_NOTARY}={url!r}: not an https:// URL (the webhook injects "
                              f"https://<service>.<namespace>.svc:<port>)")
        try:
            port = parsed.port or 443
        except ValueError as e:
            raise NotaryError(f"{keys.TH_NOTARY}={url!r}: {e}") from None
        if not ca_pem.strip():
            raise NotaryError(f"{keys.TH_NOTARY_CA} is empty: the notary's certificate cannot be verified (the "
                              f"webhook injects its CA bundle with {keys.TH_NOTARY})")
        try:
            self.context = ssl.create_default_context(cadata=ca_pem)
        except (ssl.SSLError, ValueError) as e:
            raise NotaryError(f"{keys.TH_NOTARY_CA} is not a PEM CA bundle: {e}") from None
        self.url = url.strip().rstrip("/")
        self.host, self.port, self.base = parsed.hostname, port, parsed.path.rstrip("/")
        self.token_file, self.timeout = token_file, timeout

    # --- the calls of docs/operate/security.md ------------------------------------------------------------------------
    def credential(self) -> dict:
        """POST /v1/credential once: {"namespace", "job", "gang", "key"} (NotaryError otherwise)."""
        answer = self.call("POST", "/v1/credential", {})
        key = answer.get("key")
        if not isinstance(key, str) or len(key) < 32:
            raise NotaryError(f"the notary at {self.url} answered no key: {str(answer)[:200]}")
        try:
            bytes.fromhex(key)
        except ValueError:
            raise NotaryError(f"the notary at {self.url} answered a key that is not hex") from None
        return answer

    def gang_key(self, namespace: str, job: str, deadline: float, log: Callable[[str], None] = say) -> bytes:
        """The gang's signing key, asking until `deadline` seconds have passed (jittered 0.2-2 s apart: the
        notary answers 503 until rank 0's pod exists); NotaryError naming the notary and its last answer."""
        end = time.monotonic() + deadline
        ceiling, said = FIRST_DELAY * 2, ""
        while True:
            try:
                answer = self.credential()
            except NotaryError as e:
                last, left = str(e), end - time.monotonic()
                if left <= 0:
                    raise NotaryError(f"no key for gang {namespace}/{job} from the notary at {self.url} within "
                                      f"{deadline:g}s; its last answer: {last}", e.status) from None
                if last != said:
                    log(f"waiting for the gang's key from the notary: {last}; retrying")
                    said = last
                time.sleep(min(left, random.uniform(FIRST_DELAY, ceiling)))
                ceiling = min(ceiling * 2, MAX_DELAY)
                continue
            if (answer.get("namespace"), answer.get("job")) != (namespace, job):
                raise NotaryError(f"the notary at {self.url} answered for gang {answer.get('namespace')}/"
                                  f"{answer.get('job')}, but this pod is in {namespace}/{job}")
            return bytes.fromhex(answer["key"])

    def recorded_outcome(self) -> Outcome | None:
        """GET /v1/outcome: what the notary has recorded for this gang (None: nothing yet)."""
        answer = self.call("GET", "/v1/outcome")
        return None if answer.get("outcome") is None else self._outcome(answer["outcome"])

    def record_outcome(self, outcome: Outcome, details: dict | None = None) -> Outcome:
        """POST /v1/outcome (the coordinator only): the notary records it once on the gang's workloads, scales a
        StatefulSet to zero and emits an Event; returns the recorded outcome (an earlier one wins). `details`
        join the outcome's fields: `started` (RFC 3339) and `logs` ({rank: its last lines}), which the notary
        keeps, bounded, for a finished gang's `trainhook status` and `logs`."""
        answer = self.call("POST", "/v1/outcome", {"outcome": {**outcome.to_dict(), **(details or {})}})
        return self._outcome(answer.get("outcome"))

    def emit_event(self, type_: str, reason: str, message: str) -> None:
        """POST /v1/event (the coordinator only): an Event on the gang's workloads."""
        self.call("POST", "/v1/event", {"type": type_, "reason": reason, "message": message})

    def report_progress(self, detail: dict) -> None:
        """POST /v1/progress (the coordinator only): the training's newest progress report (launcher/progress.py
        normalize), which the notary writes on the gang's workload; HTTP 429 when sent faster than it allows."""
        self.call("POST", "/v1/progress", {"progress": detail})

    # --- plumbing ---------------------------------------------------------------------------------------------
    def _outcome(self, data: object) -> Outcome:
        try:
            return Outcome.from_dict(data if isinstance(data, dict) else {})
        except ValueError as e:
            raise NotaryError(f"the notary at {self.url} answered no outcome: {e}") from None

    def token(self) -> str:
        """The pod's identity token, read now (the kubelet replaces the file before the token expires)."""
        try:
            with open(self.token_file, encoding="utf-8") as f:
                return f.read().strip()
        except OSError as e:
            raise NotaryError(f"cannot read this pod's identity token {self.token_file}: {e.strerror or e} (is "
                              f"the {keys.IDENTITY_VOLUME} volume mounted? the webhook injects it)") from None

    def connection(self) -> http.client.HTTPSConnection:
        """A new connection for one call (a launcher's few calls are seconds to minutes apart)."""
        return http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout, context=self.context)

    def call(self, method: str, path: str, body: dict | None = None) -> dict:
        """One HTTPS call; the JSON object of a 200, else NotaryError with the status and the notary's words."""
        headers = {"Authorization": f"Bearer {self.token()}", "Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        connection = self.connection()
        try:
            connection.request(method, self.base + path, body=data, headers=headers)
            response = connection.getresponse()
            text = response.read(ANSWER_LIMIT)
            status = response.status
        except ssl.SSLError as e:
            raise NotaryError(f"the notary at {self.url} failed TLS verification against {keys.TH_NOTARY_CA}: "
                              f"{e}") from None
        except (OSError, http.client.HTTPException) as e:
            raise NotaryError(f"the notary at {self.url} is not reachable: {describe_notary_error(e)}") from None
        finally:
            connection.close()
        try:
            answer = json.loads(text) if text else {}
        except ValueError:
            answer = {"error": text[:200].decode("utf-8", "replace")}
        if not isinstance(answer, dict):
            answer = {"error": str(answer)[:200]}
        if status != 200:
            raise NotaryError(f"{method} {path}: HTTP {status}: {answer.get('error') or answer}", status)
        return answer


def describe_notary_error(error: BaseException) -> str:
    if isinstance(error, socket.gaierror):
        return "its name does not resolve"
    if isinstance(error, ConnectionRefusedError):
        return "connection refused"
    if isinstance(error, (socket.timeout, TimeoutError)):
        return "timed out"
    return str(error) or type(error).__name__


def from_env(env: Mapping[str, str]) -> NotaryClient | None:
    """The notary the webhook named in this pod's environment, or None when it named none (a pod not admitted
    by a webhook with a notary). NotaryError for values that cannot be used."""
    url = env.get(keys.TH_NOTARY, "").strip()
    if not url:
        return None
    return NotaryClient(url, env.get(keys.TH_NOTARY_CA, ""), env.get(TH_IDENTITY_TOKEN, "").strip() or TOKEN_FILE)


def from_settings(settings: LaunchSettings) -> NotaryClient | None:
    """from_env, for what policy.read_settings kept of the same variables."""
    if not settings.notary_url:
        return None
    return NotaryClient(settings.notary_url, settings.notary_ca, settings.identity_token)


def emit_in_background(notary: NotaryClient | None, type_: str, reason: str, message: str, log=say) -> None:
    """Hand an Event to the notary on a thread of its own: best effort, never holding the gang up (the
    coordinator's gang restarts, through gang_run)."""
    if notary is None:
        return

    def send() -> None:
        try:
            notary.emit_event(type_, reason, message)
        except NotaryError as e:
            log(f"the {reason} Event was not emitted: {e}")

    threading.Thread(target=send, daemon=True, name="notary-event").start()
