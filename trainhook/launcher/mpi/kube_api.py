"""The launcher's Kubernetes API client, on the standard library alone (http.client, ssl, a small websocket).

Why not the `kubernetes` package: the launcher is delivered into the user's own training image and runs on
that image's Python (3.8 or newer), where nothing but the standard library can be assumed (deliver.py). What the
launcher asks of the API is small: a JSON GET (kubexec finds its peers' pods) and one websocket for the exec API
(kubexec; its framing is kube_websocket.py); merge-PATCH is the tests' recorder's (tests/support/outcome_api.py).
This module is that much and no more.

Credentials, in the order the launcher looks for them:
- in a pod: the ServiceAccount the kubelet mounts (its `token`, re-read for every call because bound tokens
  are rotated, and `ca.crt`), the API server at $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT;
- outside a pod (kubexec by hand): a kubeconfig ($KUBECONFIG, else ~/.kube/config) written as JSON, with a
  token, a token file or a client certificate (files or data). A YAML kubeconfig or an exec/auth-provider
  plugin is refused with one line that says what to do (the standard library reads no YAML).

Every refusal becomes an `ApiError` whose text is the API server's own Status message and the HTTP code,
e.g. `pods "w-0" is forbidden: User "system:serviceaccount:ns:default" cannot get resource "pods" ... (HTTP 403)`.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import socket
import ssl
import tempfile
from pathlib import Path
from typing import Callable, Mapping
from urllib.parse import urlsplit

from trainhook.launcher.mpi.kube_websocket import WebSocket, accept_key

TIMEOUT = 10.0
MERGE_PATCH = "application/merge-patch+json"
MAX_HEAD = 65536


class KubeError(Exception):
    """The API could not be used for this call; the message says why, in one line."""


class NoCredentials(KubeError):
    """Nothing here says how to reach an API server (not a pod, no usable kubeconfig)."""


class ApiUnreachable(KubeError):
    """The API server did not answer (connection refused, TLS failure, timeout)."""


class ApiError(KubeError):
    """The API server answered with an error; `status` is the HTTP code."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def status_message(code: int, reason: str, body: bytes) -> str:
    """The API server's Status message and the code (`pod w-0 does not have a host assigned (HTTP 400)`); the
    HTTP reason when the body is not a Status."""
    try:
        status = json.loads(body.decode("utf-8", "replace"))
    except ValueError:
        status = None
    if isinstance(status, dict) and (status.get("message") or status.get("reason")):
        return f"{status.get('message') or status.get('reason')} (HTTP {status.get('code') or code})"
    return f"{reason or 'error'} (HTTP {code})"


class Client:
    """An API server and how to authenticate to it. Stateless between calls (one connection per call), so
    it is safe from any thread; `with` is accepted for symmetry with other clients and closes nothing."""

    def __init__(self, host: str, port: int, context: ssl.SSLContext, token: Callable[[], str] | None = None,
                 timeout: float = TIMEOUT):
        self.host, self.port, self.context, self.token, self.timeout = host.strip("[]"), port, context, token, timeout

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    @property
    def where(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def headers(self) -> dict[str, str]:
        token = self.token() if self.token else ""
        return {"Authorization": f"Bearer {token}"} if token else {}

    def request(self, method: str, path: str, body: object = None, content_type: str = "application/json") -> dict:
        """One JSON call; the decoded answer, or ApiError / ApiUnreachable."""
        headers = {"Accept": "application/json", **self.headers()}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        connection = http.client.HTTPSConnection(self.host, self.port, context=self.context, timeout=self.timeout)
        try:
            connection.request(method, path, body=data, headers=headers)
            response = connection.getresponse()
            raw = response.read()
        except (OSError, http.client.HTTPException) as e:
            raise ApiUnreachable(f"the API server at {self.where} is not reachable ({e})") from e
        finally:
            connection.close()
        if response.status >= 300:
            raise ApiError(response.status, status_message(response.status, response.reason, raw))
        try:
            return json.loads(raw.decode("utf-8")) if raw else {}
        except ValueError as e:
            raise ApiUnreachable(f"the API server at {self.where} answered {method} {path} with no JSON") from e

    def get(self, path: str) -> dict:
        return self.request("GET", path)

    def merge_patch(self, path: str, body: dict) -> dict:
        return self.request("PATCH", path, body, MERGE_PATCH)

    def websocket(self, path: str, protocols: tuple[str, ...]) -> WebSocket:
        """Open a websocket (RFC 6455) on `path`; a refused upgrade raises ApiError with the server's Status."""
        key = base64.b64encode(os.urandom(16)).decode()
        head = [f"GET {path} HTTP/1.1", f"Host: {self.where}", "Upgrade: websocket", "Connection: Upgrade",
                f"Sec-WebSocket-Key: {key}", "Sec-WebSocket-Version: 13",
                f"Sec-WebSocket-Protocol: {', '.join(protocols)}"]
        head += [f"{name}: {value}" for name, value in self.headers().items()]
        sock = None
        try:
            sock = self.context.wrap_socket(socket.create_connection((self.host, self.port), timeout=self.timeout),
                                            server_hostname=self.host)
            sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
            code, reason, headers, rest = read_head(sock)
            if code != 101:
                raise ApiError(code, status_message(code, reason, read_body(sock, headers, rest)))
            if headers.get("sec-websocket-accept") != accept_key(key):
                raise ApiUnreachable(f"the API server at {self.where} answered the websocket upgrade wrongly")
        except (OSError, ValueError, KubeError) as e:
            if sock is not None:
                sock.close()
            if isinstance(e, KubeError):
                raise
            raise ApiUnreachable(f"the API server at {self.where} is not reachable ({e})") from e
        sock.settimeout(None)  # an exec runs as long as its command
        return WebSocket(sock, headers.get("sec-websocket-protocol", ""), rest)


def read_head(sock: socket.socket) -> tuple[int, str, dict[str, str], bytes]:
    """(code, reason, lower-cased headers, bytes read past the head) of an HTTP/1.1 answer."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk or len(data) > MAX_HEAD:
            raise ValueError("the connection closed before an HTTP answer")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("iso-8859-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(parts[1]), parts[2] if len(parts) > 2 else "", headers, rest


def read_body(sock: socket.socket, headers: Mapping[str, str], rest: bytes) -> bytes:
    """A refused upgrade's body: by its Content-Length, else up to the close (bounded by MAX_HEAD and the
    socket's timeout); a chunked one is decoded."""
    chunked = headers.get("transfer-encoding", "").lower() == "chunked"
    length = min(int(headers.get("content-length", MAX_HEAD)), MAX_HEAD)
    data = rest
    while len(data) < length and not (chunked and data.endswith(b"0\r\n\r\n")):
        try:
            chunk = sock.recv(65536)
        except OSError:
            break
        if not chunk:
            break
        data += chunk
    return dechunk(data) if chunked else data[:length]


def dechunk(data: bytes) -> bytes:
    body = b""
    while data:
        size, _, data = data.partition(b"\r\n")
        n = int(size.split(b";")[0] or b"0", 16)
        if n == 0:
            break
        body, data = body + data[:n], data[n + 2:]
    return body


# --- credentials ---------------------------------------------------------------------------------------------

def token_reader(path: Path) -> Callable[[], str]:
    def read() -> str:
        try:
            return path.read_text().strip()
        except OSError as e:
            raise NoCredentials(f"cannot read the token {path}: {e.strerror or e}") from e
    return read


def in_cluster(service_account_dir: str | Path, env: Mapping[str, str] | None = None) -> Client:
    """A client as the pod's ServiceAccount; NoCredentials when this is not a pod with a mounted token."""
    env = os.environ if env is None else env
    host, port = env.get("KUBERNETES_SERVICE_HOST", "").strip(), env.get("KUBERNETES_SERVICE_PORT", "").strip()
    if not host:
        raise NoCredentials("not in a Kubernetes pod (no KUBERNETES_SERVICE_HOST)")
    directory = Path(service_account_dir)
    token = directory / "token"
    try:
        if not token.is_file():
            raise OSError(f"no {token}")
        context = ssl.create_default_context(cafile=str(directory / "ca.crt"))
    except (OSError, ssl.SSLError) as e:
        raise NoCredentials(f"no usable ServiceAccount credentials in {directory} ({e}); is "
                            f"automountServiceAccountToken off?") from e
    return Client(host, int(port or 443), context, token_reader(token))


def default_kubeconfig(env: Mapping[str, str]) -> Path:
    paths = [p for p in env.get("KUBECONFIG", "").split(os.pathsep) if p]
    return Path(paths[0]) if paths else Path(env.get("HOME") or Path.home()) / ".kube" / "config"


def from_kubeconfig(path: Path) -> Client:
    """A client from a JSON kubeconfig's current context; NoCredentials naming what is missing or unsupported."""
    convert = "kubectl config view --raw --minify --flatten -o json > FILE, then KUBECONFIG=FILE"
    try:
        config = json.loads(path.read_text())
    except OSError as e:
        raise NoCredentials(f"no kubeconfig at {path} ({e.strerror or e})") from e
    except ValueError as e:
        raise NoCredentials(f"kubeconfig {path} is not JSON: outside a pod the launcher reads only a JSON "
                            f"kubeconfig ({convert})") from e

    def named(section: str, name: str) -> dict:
        for entry in config.get(section) or []:
            if entry.get("name") == name:
                return entry.get(section[:-1]) or {}
        raise NoCredentials(f"kubeconfig {path}: no {section[:-1]} {name!r}")
    context = named("contexts", config.get("current-context", ""))
    cluster, user = named("clusters", context.get("cluster", "")), named("users", context.get("user", ""))
    unsupported = sorted(set(user) & {"exec", "auth-provider", "username", "password"})
    if unsupported:
        raise NoCredentials(f"kubeconfig {path}: user {context.get('user')!r} authenticates with "
                            f"{', '.join(unsupported)}, which the launcher does not support; use a token, a token "
                            f"file or a client certificate")
    url = urlsplit(cluster.get("server", ""))
    if url.scheme != "https" or not url.hostname:
        raise NoCredentials(f"kubeconfig {path}: server {cluster.get('server')!r} is not an https:// URL")
    base = path.parent

    def material(field: str, suffix: str) -> Path | None:
        """A file for `field` (relative to the kubeconfig) or `field-data` (written to a private temp file)."""
        encoded = cluster.get(f"{field}-data") or user.get(f"{field}-data")
        if encoded:
            data = base64.b64decode(encoded)
            handle, name = tempfile.mkstemp(suffix=suffix)
            with os.fdopen(handle, "wb") as out:
                out.write(data)
            return Path(name)
        value = cluster.get(field) or user.get(field)
        return base / value if value else None

    files = {field: material(field, suffix) for field, suffix in (
        ("certificate-authority", ".crt"), ("client-certificate", ".crt"), ("client-key", ".key"))}
    ca, cert, key = (files[f] for f in ("certificate-authority", "client-certificate", "client-key"))
    try:
        ssl_context = ssl.create_default_context(cafile=None if ca is None else str(ca))
        if cluster.get("insecure-skip-tls-verify"):
            ssl_context.check_hostname, ssl_context.verify_mode = False, ssl.CERT_NONE
        if cert is not None:
            ssl_context.load_cert_chain(str(cert), None if key is None else str(key))
    except (OSError, ssl.SSLError) as e:
        raise NoCredentials(f"kubeconfig {path}: unusable certificates ({e})") from e
    finally:
        for field, file in files.items():
            if file is not None and (cluster.get(f"{field}-data") or user.get(f"{field}-data")):
                file.unlink()
    token: Callable[[], str] | None = None
    if user.get("token"):
        token = (lambda value: lambda: value)(user["token"])
    elif user.get("tokenFile"):
        token = token_reader(base / user["tokenFile"])
    return Client(url.hostname, url.port or 443, ssl_context, token)


def any_client(service_account_dir: str | Path, env: Mapping[str, str] | None = None) -> Client:
    """The pod's ServiceAccount in a pod, else the kubeconfig."""
    env = os.environ if env is None else env
    if env.get("KUBERNETES_SERVICE_HOST", "").strip():
        return in_cluster(service_account_dir, env)
    try:
        return from_kubeconfig(default_kubeconfig(env))
    except NoCredentials as e:
        raise NoCredentials(f"no Kubernetes credentials: not in a pod with a ServiceAccount token, and {e}") from e
