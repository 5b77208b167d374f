"""A real API server that refuses: the credentials (401) or the call (403). Every cluster command says it in one
line naming the server and the fix, and the SDK raises one ClusterDenied (a PermissionError), never a traceback
(issue 34; the servers that are not there at all are tests/cli/test_cli_cluster_unreachable.py's)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cluster_api import cluster, wait_for_service_account_token
from trainhook import TrainingClient
from trainhook.cluster.client import ClusterDenied

pytestmark = pytest.mark.cluster


def kubeconfig(path: Path, control_plane, user: str, token: str) -> Path:
    path.write_text(json.dumps(cluster.kubeconfig_dict(control_plane.host, control_plane.ca_pem, user, token=token)))
    return path


def run_cli(config: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainhook.cli", args[0], "--kubeconfig", str(config), *args[1:]],
                          capture_output=True, text=True, timeout=120)


def one_line(result: subprocess.CompletedProcess) -> str:
    assert (result.returncode, result.stdout) == (1, "")
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.parametrize("command", [["list"], ["status", "mnist"], ["logs", "mnist"], ["delete", "mnist"],
                                     ["submit", "mnist", "--workers", "1", "--image", "i", "--", "python", "/t.py"]],
                         ids=["list", "status", "logs", "delete", "submit"])
def test_credentials_the_server_does_not_accept_are_one_line_naming_it(control_plane, tmp_path, command):
    config = kubeconfig(tmp_path / "kubeconfig", control_plane, "stranger", "not-a-token-of-this-cluster")
    line = one_line(run_cli(config, *command))
    assert line == (f"error: the Kubernetes API server {control_plane.host} (kubeconfig {config}, context trainhook) "
                    "refused the credentials (401 Unauthorized). Fix: log in again or get a fresh kubeconfig (the "
                    "token or client certificate has expired, been revoked, or is another cluster's); --kubeconfig "
                    "(or $KUBECONFIG) and --context choose the cluster")


def test_a_user_without_the_permission_is_told_which_and_where(control_plane, k8s_namespace, tmp_path):
    with control_plane.api_client() as api:
        token = wait_for_service_account_token(api, k8s_namespace, "default")  # bound to no role
    config = kubeconfig(tmp_path / "kubeconfig", control_plane, "default", token)
    line = one_line(run_cli(config, "list", "-n", k8s_namespace))
    assert line.startswith(f'Error from server (Forbidden): statefulsets.apps is forbidden: User '
                           f'"system:serviceaccount:{k8s_namespace}:default" cannot list resource "statefulsets" ')
    assert line.endswith(f"(API server {control_plane.host}, kubeconfig {config}, context trainhook). Fix: ask the "
                         "cluster's admin for that permission (check with kubectl auth can-i), or use a --context "
                         "whose user has it")


def test_the_sdk_raises_one_permission_error(control_plane, tmp_path):
    config = kubeconfig(tmp_path / "kubeconfig", control_plane, "stranger", "not-a-token-of-this-cluster")
    with pytest.raises(ClusterDenied) as raised:
        TrainingClient(config_file=str(config), namespace="default").list_jobs()
    assert isinstance(raised.value, PermissionError)
    assert (raised.value.status, raised.value.server) == (401, control_plane.host)
    assert raised.value.__suppress_context__ and raised.value.__cause__ is None
