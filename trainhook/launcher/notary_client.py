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

Standard library only, Python 3.8+ (it runs inside the user's image). The HTTP/1.1 of a call is written here over
the ssl socket (one request, `Connection: close`, the answer read by its Content-Length or chunks, strictly),
not with http.client: http.client imports the `email` package, and its import was ~10 ms of CPU in every training
container's start (issue 32: a 32-pod gang's launchers start together on a node's cores;
docs/develop/performance.md).
"""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time

from trainhook.gang import keys
from trainhook.launcher.policy import IDENTITY_TOKEN_FILE as TOKEN_FILE
from trainhook.launcher.outcome import Outcome
from trainhook.launcher.policy import LaunchSettings
from trainhook.launcher.reach import ascii_name, dial, uniform
from trainhook.launcher.speak import speaker
from trainhook.gang.keys import TH_IDENTITY_TOKEN

TYPE_CHECKING = False  # typing's own, without importing typing (trainhook/launcher/__init__.py says why)
if TYPE_CHECKING:
    from typing import Callable, Mapping

CALL_TIMEOUT = 10.0  # one HTTPS call (connect, TLS, answer); the notary itself waits on the API server
FIRST_DELAY, MAX_DELAY = 0.2, 2.0  # jittered retry delays while the notary cannot answer yet
ANSWER_LIMIT = 1 << 20
HEAD_LIMIT = 64 << 10  # an answer's status line and headers; more is not the notary


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

    def __init__(self, url: str, ca_pem: str, token_file: str = TOKEN_FILE, timeout: float = CALL_TIMEOUT,
                 context: ssl.SSLContext | None = None):
        """`context`: a TLS client context already made from `ca_pem` (a process simulating many pods makes one;
        a pod's launcher makes its own, once)."""
        try:
            host, port, base = split_url(url)
        except ValueError as e:
            raise NotaryError(f"{keys.TH_NOTARY}={url!r}: {e}") from None
        if not ca_pem.strip():
            raise NotaryError(f"{keys.TH_NOTARY_CA} is empty: the notary's certificate cannot be verified (the "
                              f"webhook injects its CA bundle with {keys.TH_NOTARY})")
        try:
            self.context = context or ssl.create_default_context(cadata=ca_pem)
        except (ssl.SSLError, ValueError) as e:
            raise NotaryError(f"{keys.TH_NOTARY_CA} is not a PEM CA bundle: {e}") from None
        self.url = url.strip().rstrip("/")
        self.host, self.port, self.base = host, port, base.rstrip("/")
        self.token_file, self.timeout = token_file, timeout
        self.source_address: tuple[str, int] | None = None  # the local address to connect from (None: the kernel's)

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
                time.sleep(min(left, uniform(FIRST_DELAY, ceiling)))
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

    def connection(self) -> ssl.SSLSocket:
        """A new TLS connection for one call (a launcher's few calls are seconds to minutes apart): the notary's
        certificate verified against its CA, for its host name; `timeout` on the connect, the handshake and each
        read. TCP_NODELAY as http.client sets it: the request goes out right behind the handshake's last message
        (two writes, then a read), which Nagle's algorithm would hold until the server's delayed ACK (~40 ms).
        The host name goes to the lookup (reach.dial) and to ssl as reach.ascii_name gives it: no idna codec."""
        raw = dial(self.host, self.port, self.timeout, self.source_address)
        try:
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return self.context.wrap_socket(raw, server_hostname=ascii_name(self.host))
        except BaseException:
            raw.close()
            raise

    def call(self, method: str, path: str, body: dict | None = None) -> dict:
        """One HTTPS call; the JSON object of a 200, else NotaryError with the status and the notary's words."""
        data = b"" if body is None else json.dumps(body).encode()
        token = self.token()
        if "\r" in token or "\n" in token:
            raise NotaryError(f"this pod's identity token {self.token_file} holds a line break: not a token")
        head = [f"{method} {self.base + path} HTTP/1.1", f"Host: {host_header(self.host, self.port)}",
                f"Authorization: Bearer {token}", "Accept: application/json", "Connection: close"]
        if body is not None:
            head += [f"Content-Length: {len(data)}", "Content-Type: application/json"]
        try:
            connection = self.connection()
            try:
                connection.sendall("\r\n".join(head).encode("latin-1") + b"\r\n\r\n" + data)
                status, text = read_answer(connection)
            finally:
                connection.close()
        except ssl.SSLError as e:
            raise NotaryError(f"the notary at {self.url} failed TLS verification against {keys.TH_NOTARY_CA}: "
                              f"{e}") from None
        except (OSError, AnswerError) as e:
            raise NotaryError(f"the notary at {self.url} is not reachable: {describe_notary_error(e)}") from None
        try:
            answer = json.loads(text) if text else {}
        except ValueError:
            answer = {"error": text[:200].decode("utf-8", "replace")}
        if not isinstance(answer, dict):
            answer = {"error": str(answer)[:200]}
        if status != 200:
            raise NotaryError(f"{method} {path}: HTTP {status}: {answer.get('error') or answer}", status)
        return answer


class AnswerError(Exception):
    """The notary's answer is not HTTP/1.x as it sends it (what http.client called an HTTPException)."""


def split_url(url: str) -> tuple[str, int, str]:
    """(host, port, path) of an https:// URL, as urllib.parse.urlsplit reads it (the host lower-cased, without
    brackets around an IPv6 address, port 443 when none is given); ValueError naming what is wrong."""
    text = url.strip()
    scheme, sep, rest = text.partition("://")
    if not sep or scheme.lower() != "https":
        raise ValueError("not an https:// URL (the webhook injects https://<service>.<namespace>.svc:<port>)")
    end = min([i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0] or [len(rest)])
    netloc, path = rest[:end], rest[end:].partition("?")[0].partition("#")[0]
    where = netloc.rpartition("@")[2]
    if where.startswith("["):
        host, bracket, port_text = where[1:].partition("]")
        if not bracket or (port_text and not port_text.startswith(":")):
            raise ValueError("an IPv6 host needs its closing bracket, then :port or nothing")
        port_text = port_text[1:]
    else:
        host, _, port_text = where.partition(":")
    if not host:
        raise ValueError("not an https:// URL (the webhook injects https://<service>.<namespace>.svc:<port>)")
    if not port_text:
        return host.lower(), 443, path
    if not (port_text.isascii() and port_text.isdigit()) or int(port_text) > 65535:
        raise ValueError(f"port {port_text!r} is not a number from 0 to 65535")
    return host.lower(), int(port_text), path


def host_header(host: str, port: int) -> str:
    """The Host header of a request to host:port (brackets around an IPv6 address; no port when it is 443)."""
    name = f"[{host}]" if ":" in host else host
    return name if port == 443 else f"{name}:{port}"


def read_answer(connection: socket.socket) -> tuple[int, bytes]:
    """(status, body) of one HTTP/1.x answer read from `connection` to its end: its Content-Length, its chunks, or
    the connection's close (the request said `Connection: close`). The body is cut at ANSWER_LIMIT, as
    http.client's read(ANSWER_LIMIT) cut it; AnswerError for anything that is not such an answer, OSError (a
    timeout among them) from the socket."""
    data = b""
    while b"\r\n\r\n" not in data:
        if len(data) > HEAD_LIMIT:
            raise AnswerError(f"an answer whose head is over {HEAD_LIMIT} bytes")
        chunk = connection.recv(16384)
        if not chunk:
            raise AnswerError("the connection closed before an HTTP answer" if not data else
                              "the connection closed in the answer's head")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    version, _, status_text = lines[0].partition(" ")
    status_text = status_text.partition(" ")[0]
    if not version.startswith("HTTP/1.") or len(status_text) != 3 or not status_text.isdigit():
        raise AnswerError(f"not an HTTP/1.x status line: {lines[0][:100]!r}")
    headers = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip():
            raise AnswerError(f"not an HTTP header line: {line[:100]!r}")
        headers[name.lower()] = value.strip()
    status = int(status_text)
    if status in (204, 304) or 100 <= status < 200:
        return status, b""
    if headers.get("transfer-encoding", "").lower() == "chunked":
        return status, read_chunked(connection, rest)
    if "transfer-encoding" in headers:
        raise AnswerError(f"an answer in transfer-encoding {headers['transfer-encoding']!r}")
    length = headers.get("content-length")
    if length is not None and not (length.isascii() and length.isdigit()):
        raise AnswerError(f"an answer whose Content-Length is {length[:40]!r}")
    want = ANSWER_LIMIT if length is None else min(int(length), ANSWER_LIMIT)
    body = fill(connection, rest, want)[:want]
    if length is not None and len(body) < want:
        raise AnswerError(f"the connection closed {want - len(body)} bytes short of the answer's Content-Length")
    return status, body


def fill(connection: socket.socket, data: bytes, want: int) -> bytes:
    """`data` and what follows on `connection` until there are `want` bytes or it closes (it may hold more)."""
    parts, have = [data], len(data)
    while have < want:
        chunk = connection.recv(min(65536, want - have))
        if not chunk:
            break
        parts.append(chunk)
        have += len(chunk)
    return b"".join(parts)


def read_chunked(connection: socket.socket, data: bytes) -> bytes:
    """A chunked body (RFC 9112 7.1), up to ANSWER_LIMIT; AnswerError for a malformed one or an early close."""
    body = b""
    while True:
        while b"\r\n" not in data:
            if len(data) > 1024:
                raise AnswerError("a chunk size line over 1024 bytes")
            chunk = connection.recv(16384)
            if not chunk:
                raise AnswerError("the connection closed in a chunked answer")
            data += chunk
        size_line, _, data = data.partition(b"\r\n")
        size_text = size_line.partition(b";")[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise AnswerError(f"not a chunk size: {size_line[:40]!r}") from None
        if size_text.startswith((b"-", b"+", b"0x", b"0X")) or size < 0:
            raise AnswerError(f"not a chunk size: {size_line[:40]!r}")
        if size == 0:
            return body
        data = fill(connection, data, size + 2)
        if len(data) < size + 2 or data[size:size + 2] != b"\r\n":
            raise AnswerError("a chunk cut short or not followed by CRLF")
        body += data[:size]
        data = data[size + 2:]
        if len(body) >= ANSWER_LIMIT:
            return body[:ANSWER_LIMIT]


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
