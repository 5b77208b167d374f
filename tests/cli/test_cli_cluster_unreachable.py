"""An API server that is not there, or is not one: every cluster command says so in one line, naming the server and
the fix, and the SDK raises one ClusterUnreachable (a ConnectionError), never urllib3's chain (issue 34).

The servers are real sockets on this machine: a port bound with nothing listening (connection refused), a TLS
server whose certificate another CA signed, and a plain-HTTP server; the commands are the installed CLI run as
a subprocess, with a kubeconfig pointing at them.
"""

from __future__ import annotations

import http.server
import json
import socket
import ssl
import subprocess
import sys
import threading
import traceback
from pathlib import Path

import pytest

from trainhook.certs.build import CA_FILE, CERT_FILE, KEY_FILE, write_bundle
from trainhook.cluster import reach
from trainhook.cluster.client import ClusterUnreachable

MANIFEST = """\
apiVersion: v1
kind: Service
metadata: {name: solo, labels: {trainhook.dev/job-name: solo}}
spec: {clusterIP: None, selector: {trainhook.dev/job-name: solo}}
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: solo
  labels: {trainhook.dev/framework: pytorch, trainhook.dev/job-name: solo}
spec:
  serviceName: solo
  replicas: 2
  selector: {matchLabels: {trainhook.dev/job-name: solo}}
  template:
    metadata: {labels: {trainhook.dev/framework: pytorch, trainhook.dev/job-name: solo}}
    spec:
      containers: [{name: pytorch, image: example.com/train:1, command: [python, /train.py]}]
"""
# Every subcommand that talks to the cluster, with what it needs besides --kubeconfig.
COMMANDS = {
    "list": ["list"],
    "status": ["status", "mnist"],
    "logs": ["logs", "mnist"],
    "delete": ["delete", "mnist"],
    "submit-flags": ["submit", "mnist", "--workers", "2", "--image", "example.com/train:1", "--", "python", "t.py"],
    "submit-file": ["submit", "-f", "MANIFEST"],
}


def kubeconfig(path: Path, server: str, ca_pem: bytes | None = None) -> Path:
    """A kubeconfig whose one context (`lab`) points at `server`, trusting `ca_pem`."""
    import base64

    cluster: dict = {"server": server}
    if ca_pem:
        cluster["certificate-authority-data"] = base64.b64encode(ca_pem).decode()
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "lab",
        "clusters": [{"name": "lab", "cluster": cluster}], "users": [{"name": "me", "user": {"token": "t"}}],
        "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": "me", "namespace": "team"}}]}))
    return path


class Quiet(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


class Server(http.server.ThreadingHTTPServer):
    """A real HTTP server on a free port, in a thread; with `tls_dir`, HTTPS with that directory's pair."""

    daemon_threads = True

    def __init__(self, tls_dir: Path | None = None):
        super().__init__(("127.0.0.1", 0), Quiet)
        if tls_dir is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(tls_dir / CERT_FILE, tls_dir / KEY_FILE)
            self.socket = context.wrap_socket(self.socket, server_side=True)
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    def handle_error(self, request, client_address):
        pass  # a client giving up the handshake is what these tests make happen

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.server_address[1]}"

    def close(self):
        self.shutdown()
        self.server_close()


@pytest.fixture
def closed_port():
    """A port bound by a socket that never listens: a connection to it is refused, and nothing else can take it."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    yield f"https://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


@pytest.fixture
def wrong_ca_server(tmp_path):
    """(the URL of an HTTPS server whose certificate one CA signed, the PEM of another CA)."""
    served = write_bundle(tmp_path / "served", ["127.0.0.1"])
    other = write_bundle(tmp_path / "other", ["127.0.0.1"])
    server = Server(served)
    yield server.url, (other / CA_FILE).read_bytes()
    server.close()


@pytest.fixture
def plain_http_server():
    server = Server()
    yield server.url  # https:// to a port that answers plain HTTP
    server.close()


def run_cli(tmp_path: Path, config: Path, command: list[str]) -> subprocess.CompletedProcess:
    manifest = tmp_path / "solo.yaml"
    manifest.write_text(MANIFEST)
    argv = [str(manifest) if word == "MANIFEST" else word for word in command]
    # --kubeconfig right after the subcommand: after `--` it would be the training command's
    return subprocess.run([sys.executable, "-m", "trainhook.cli", argv[0], "--kubeconfig", str(config), *argv[1:]],
                          capture_output=True, text=True, timeout=120)


def assert_one_line(result: subprocess.CompletedProcess, server: str, config: Path, *fragments: str) -> str:
    assert result.returncode == 1, result
    assert "Traceback" not in result.stdout + result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith(f"error: cannot connect to the Kubernetes API server {server} "
                           f"(kubeconfig {config}, context lab): ")
    assert "Fix: " in line
    for fragment in fragments:
        assert fragment in line
    return line


@pytest.mark.parametrize("command", COMMANDS.values(), ids=COMMANDS.keys())
def test_every_cluster_command_says_in_one_line_that_nothing_listens_at_the_server(tmp_path, closed_port, command):
    config = kubeconfig(tmp_path / "kubeconfig", closed_port)
    assert_one_line(run_cli(tmp_path, config, command), closed_port, config,
                    "connection refused: nothing listens at that address",
                    "Fix: start the cluster, or point at the running one", "--context")


@pytest.mark.parametrize("command", [COMMANDS["status"], COMMANDS["submit-flags"]], ids=["status", "submit"])
def test_a_server_whose_certificate_another_ca_signed_is_named_with_the_ca_fix(tmp_path, wrong_ca_server, command):
    url, other_ca = wrong_ca_server
    config = kubeconfig(tmp_path / "kubeconfig", url, other_ca)
    assert_one_line(run_cli(tmp_path, config, command), url, config,
                    "its TLS certificate is not trusted (certificate verify failed",
                    "certificate-authority(-data) must be the CA that signed the API server's certificate")


@pytest.mark.parametrize("command", [COMMANDS["list"], COMMANDS["submit-file"]], ids=["list", "submit"])
def test_a_port_that_answers_plain_http_is_named_as_not_tls(tmp_path, plain_http_server, command):
    config = kubeconfig(tmp_path / "kubeconfig", plain_http_server)
    assert_one_line(run_cli(tmp_path, config, command), plain_http_server, config,
                    "it does not answer TLS (", "the API server's HTTPS address and port")


def test_a_host_name_that_does_not_resolve_is_named(tmp_path):
    server = "https://api.trainhook-test.invalid:6443"  # .invalid never resolves (RFC 2606)
    config = kubeconfig(tmp_path / "kubeconfig", server)
    assert_one_line(run_cli(tmp_path, config, COMMANDS["list"]), server, config,
                    "its host name does not resolve", "check the server address in the kubeconfig")


def test_the_sdk_raises_one_connection_error_naming_the_server(tmp_path, closed_port):
    from trainhook import TrainingClient

    config = kubeconfig(tmp_path / "kubeconfig", closed_port)
    client = TrainingClient(config_file=str(config))
    with pytest.raises(ClusterUnreachable) as raised:
        client.list_jobs()
    error = raised.value
    assert isinstance(error, ConnectionError)
    assert error.server == closed_port
    assert str(error).startswith(f"cannot connect to the Kubernetes API server {closed_port} (kubeconfig {config}, "
                                 "context lab): connection refused")
    # The traceback a notebook shows is this one exception: the client's own chain stays on .original.
    shown = "".join(traceback.format_exception(error))
    assert "urllib3" not in shown and "During handling" not in shown and "direct cause" not in shown
    assert "MaxRetryError" in type(error.original).__name__ + repr(error.original)


def test_the_sdk_with_a_client_configuration_names_its_host(wrong_ca_server, tmp_path):
    from kubernetes import client

    from trainhook import TrainingClient

    url, other_ca = wrong_ca_server
    (tmp_path / "ca.crt").write_bytes(other_ca)
    configuration = client.Configuration()
    configuration.host = url
    configuration.ssl_ca_cert = str(tmp_path / "ca.crt")
    with pytest.raises(ConnectionError) as raised:
        TrainingClient(client_configuration=configuration, namespace="team").get_job("mnist")
    assert str(raised.value).startswith(f"cannot connect to the Kubernetes API server {url}: its TLS certificate "
                                        "is not trusted")


def test_a_server_that_accepts_but_never_answers_is_a_timeout_not_a_hang():
    """What urllib3 raises when the TLS handshake gets no answer, read as a timeout (a short timeout here; the
    client's own is reach.CONNECT_TIMEOUT)."""
    import urllib3

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)  # the kernel completes the TCP handshake; nobody ever reads the ClientHello
    try:
        pool = urllib3.PoolManager(cert_reqs="CERT_NONE", retries=reach.retries())
        with pytest.raises(urllib3.exceptions.HTTPError) as raised:
            pool.request("GET", f"https://127.0.0.1:{silent.getsockname()[1]}/api",
                         timeout=urllib3.Timeout(connect=0.3, read=0.3))
    finally:
        silent.close()
    what, fix = reach.failure(raised.value)
    assert what.startswith("it did not answer in time (")
    assert "reachable from here (VPN, firewall, proxy)" in fix
