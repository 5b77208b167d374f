"""The launcher's standard-library Kubernetes client (launcher/mpi/kube_api.py): websocket framing against RFC 6455's
own numbers, credentials from a pod's ServiceAccount and from a kubeconfig, and `trainhook-launch kubexec` over
a real TLS websocket served by aiohttp (tests/support/exec_double.py), both channel protocols, IPv4 and IPv6. The API
calls against the real API server are in test_kube_api_cluster.py and test_mpi_kubexec_cluster.py."""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from exec_double import EXEC_STDOUT_TAIL, TOKEN, V4, V5, ExecServer
from trainhook.launcher.mpi import kube_api
from trainhook.launcher.mpi import kube_websocket


# --- framing ----------------------------------------------------------------------------------------------------

def test_the_accept_key_is_rfc_6455s_example():
    assert kube_websocket.accept_key("dGhlIHNhbXBsZSBub25jZQ==") == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="


@pytest.mark.parametrize("size", [0, 1, 125, 126, 65535, 65536, 200000])
def test_a_client_frame_is_masked_and_decodes_to_its_payload_at_every_length_form(size):
    payload = bytes(range(256)) * (size // 256) + bytes(range(size % 256))
    frame = kube_websocket.encode_frame(kube_websocket.BINARY, payload, b"\x01\x02\x03\x04")
    assert frame[0] == 0x82 and frame[1] & 0x80  # final, binary; masked, as a client must
    assert kube_websocket.decode_frame(frame) == (True, kube_websocket.BINARY, payload, len(frame))
    assert kube_websocket.decode_frame(frame[:-1] if size else frame[:1]) is None  # not whole yet
    if size >= 4:
        assert frame[-size:] != payload  # the mask was applied on the wire


def test_rfc_6455s_unmasked_and_masked_hello():
    """Section 5.7's examples: a single-frame unmasked and masked text message "Hello"."""
    assert kube_websocket.decode_frame(bytes.fromhex("810548656c6c6f")) == (True, kube_websocket.TEXT, b"Hello", 7)
    assert kube_websocket.decode_frame(bytes.fromhex("818537fa213d7f9f4d5158")) == (True, kube_websocket.TEXT, b"Hello", 11)
    assert kube_websocket.encode_frame(kube_websocket.TEXT, b"Hello", bytes.fromhex("37fa213d")) == bytes.fromhex(
        "818537fa213d7f9f4d5158")


def test_a_chunked_error_body_is_decoded():
    assert kube_api.dechunk(b"5\r\nHello\r\n6;x=y\r\n World\r\n0\r\n\r\n") == b"Hello World"


# --- credentials --------------------------------------------------------------------------------------------------

def test_outside_a_pod_in_cluster_credentials_are_refused_in_one_line(tmp_path):
    with pytest.raises(kube_api.NoCredentials, match=r"^not in a Kubernetes pod \(no KUBERNETES_SERVICE_HOST\)$"):
        kube_api.in_cluster(tmp_path, {})
    with pytest.raises(kube_api.NoCredentials, match=r"no usable ServiceAccount credentials in .*; is "
                                                     r"automountServiceAccountToken off\?"):
        kube_api.in_cluster(tmp_path, {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"})


def test_an_ipv6_service_host_is_bracketed_where_it_is_written():
    client = kube_api.Client("fd00::1", 443, kube_api.ssl.create_default_context())
    assert (client.host, client.where) == ("fd00::1", "[fd00::1]:443")


def kubeconfig(path: Path, user: dict, server: str = "https://127.0.0.1:6443", cluster: dict | None = None) -> Path:
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": server, **(cluster or {})}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}))
    return path


@pytest.mark.parametrize("text,message", [
    ("apiVersion: v1\nkind: Config\n", "is not JSON: outside a pod the launcher reads only a JSON kubeconfig "
     "(kubectl config view --raw --minify --flatten -o json > FILE, then KUBECONFIG=FILE)"),
    (None, "user 'u' authenticates with exec, which the launcher does not support; use a token, a token file "
     "or a client certificate"),
])
def test_a_kubeconfig_the_launcher_cannot_read_is_named_with_the_fix(tmp_path, text, message):
    path = kubeconfig(tmp_path / "config", {"exec": {"command": "aws"}})
    if text is not None:
        path.write_text(text)
    with pytest.raises(kube_api.NoCredentials) as error:
        kube_api.any_client("/nonexistent", {"KUBECONFIG": str(path)})
    assert str(error.value) == (f"no Kubernetes credentials: not in a pod with a ServiceAccount token, and "
                                f"kubeconfig {path}{':' if text is None else ''} {message}")


@pytest.fixture
def server(tmp_path):
    double = ExecServer(tmp_path / "serviceaccount")
    yield double
    double.stop()


def test_a_json_kubeconfig_with_ca_data_and_a_token_reaches_the_server(server, tmp_path):
    ca = base64.b64encode((server.directory / "ca.crt").read_bytes()).decode()
    path = kubeconfig(tmp_path / "config", {"token": TOKEN}, f"https://127.0.0.1:{server.port}",
                      {"certificate-authority-data": ca})
    client = kube_api.any_client("/nonexistent", {"KUBECONFIG": str(path)})
    assert client.get("/api/v1/namespaces/team-a/pods/w-0")["status"]["phase"] == "Running"
    with pytest.raises(kube_api.ApiError) as error:
        client.get("/api/v1/namespaces/team-a/pods/w-9")
    assert (error.value.status, str(error.value)) == (404, 'pods "w-9" not found (HTTP 404)')


def test_the_token_is_read_again_for_every_call(server):
    client = kube_api.in_cluster(server.directory, server.env)
    assert client.get("/api/v1/namespaces/team-a/pods/w-0")["metadata"]["name"] == "w-0"
    (server.directory / "token").write_text("rotated-away")
    with pytest.raises(kube_api.ApiError, match=r"^Unauthorized \(HTTP 401\)$"):
        client.get("/api/v1/namespaces/team-a/pods/w-0")


def test_an_unreachable_server_is_one_line(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = kube_api.Client("127.0.0.1", port, kube_api.ssl.create_default_context())
    with pytest.raises(kube_api.ApiUnreachable, match=rf"^the API server at 127.0.0.1:{port} is not reachable \("):
        client.get("/api")


# --- kubexec over a real websocket ------------------------------------------------------------------------------

def kubexec(server: ExecServer, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess:
    env = {"PATH": os.environ["PATH"], **server.env}
    return subprocess.run([sys.executable, "-m", "trainhook.launcher.cli", "kubexec", "--transport", "kubexec",
                           *args], input=stdin, capture_output=True, env=env, timeout=60)


@pytest.mark.parametrize("protocols", [(V5, V4), (V4,)], ids=["v5", "v4"])
@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_kubexec_relays_stdin_stdout_stderr_and_the_remote_exit_code(tmp_path, protocols, host):
    assert host != "::1" or socket.has_ipv6, "this Python has no IPv6: the bracketed-host path cannot be shown"
    double = ExecServer(tmp_path / "serviceaccount", host, protocols)
    try:
        done = kubexec(double, "-o", "ConnectionAttempts=10", "w-0.pi", "exit", "3", stdin=b"hello\n")
    finally:
        double.stop()
    assert done.returncode == 3, done.stderr
    assert done.stdout == b"HELLO\ndone\n" + EXEC_STDOUT_TAIL
    assert done.stderr == b"warning\n"
    [request] = double.requests
    assert request["query"] == [("command", "/bin/sh"), ("command", "-c"), ("command", "exit 3"),
                                ("container", "mpi"), ("stdin", "true"), ("stdout", "true"), ("stderr", "true")]
    assert (request["authorization"], request["protocols"]) == (f"Bearer {TOKEN}", f"{V5}, {V4}")


def test_kubexec_exits_0_on_success_with_no_stdin(server):
    done = kubexec(server, "w-0", "--", "true")
    assert (done.returncode, done.stdout[:5]) == (0, b"done\n"), done.stderr


def test_a_refused_exec_is_one_line_with_the_pod_its_phase_and_the_servers_message(server):
    done = kubexec(server, "pending.pi", "true")
    assert done.returncode == 255
    assert done.stderr.decode().strip() == (
        "trainhook-launch kubexec pending.pi: cannot exec in pod team-a/pending (container mpi), phase Pending, "
        "no node: pod pending does not have a host assigned (HTTP 400)")
