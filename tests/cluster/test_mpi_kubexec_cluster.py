"""`trainhook-launch kubexec` against the real control plane (Kubernetes v1.20 from tests/support/cluster_api.py), as far
as it goes without a kubelet: the agent runs as a pod would, with a ServiceAccount token mounted at
/var/run/secrets/kubernetes.io/serviceaccount (a private mount namespace) and KUBERNETES_SERVICE_HOST/PORT,
finds the pod, and makes the exec call. `kubexec` is an explicit opt-in now (the default is the gang transport,
which needs no permission) and the chart grants no exec right: with a Role scoped to the gang's own pods
(resourceNames) bound, as docs/use/frameworks/mpi.md tells a user to write it, the API server authorizes the call and
answers that the pod has no node, which the agent reports with the pod, its phase and the server's message;
without it, the agent names the missing permission."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

import pytest
from kubernetes import client

from cluster_api import wait_for_service_account_token

pytestmark = pytest.mark.cluster
SERVICE_ACCOUNT_DIR = "/run/secrets/kubernetes.io/serviceaccount"  # /var/run is /run


def as_a_pod(control_plane, namespace: str, tmp_path: Path, *agent_args: str, **env: str):
    """Run the agent with the namespace's `default` ServiceAccount, the way it runs in a pod (in-cluster config)."""
    with control_plane.api_client() as api:
        token = wait_for_service_account_token(api, namespace, "default")
    secrets = tmp_path / "serviceaccount"
    secrets.mkdir(exist_ok=True)
    (secrets / "token").write_text(token)
    (secrets / "namespace").write_text(namespace)
    (secrets / "ca.crt").write_bytes(control_plane.ca_pem)
    server = urlparse(control_plane.host)
    script = (f"mount -t tmpfs tmpfs /run && mkdir -p {SERVICE_ACCOUNT_DIR} && cp {secrets}/* {SERVICE_ACCOUNT_DIR}/ "
              f'&& exec {sys.executable} -m trainhook.launcher.cli kubexec --transport kubexec "$@"')
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *agent_args],
                          capture_output=True, text=True, timeout=60,
                          env={"PATH": os.environ["PATH"], "KUBERNETES_SERVICE_HOST": server.hostname,
                               "KUBERNETES_SERVICE_PORT": str(server.port), **env})


def bind_gang_role(control_plane, namespace: str, pods: list[str], list_pods: bool = False) -> None:
    """The per-gang Role of docs/use/frameworks/mpi.md for the namespace's `default` ServiceAccount: get and exec on
    the gang's own pods only (resourceNames); `list` (which resourceNames cannot scope) only where a pod must be
    found by its hostname (a Job's generated pod names)."""
    rules = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"], "resourceNames": pods},
             {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create", "get"], "resourceNames": pods}]
    if list_pods:
        rules.append({"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]})
    with control_plane.api_client() as api:
        rbac = client.RbacAuthorizationV1Api(api)
        rbac.create_namespaced_role(namespace, {"metadata": {"name": "pi-kubexec"}, "rules": rules})
        rbac.create_namespaced_role_binding(namespace, {
            "metadata": {"name": "pi-kubexec"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pi-kubexec"},
            "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": namespace}]})


def create_pod(control_plane, namespace: str, name: str, hostname: str, containers=("mpi",),
               annotations: dict | None = None) -> None:
    with control_plane.api_client() as api:
        client.CoreV1Api(api).create_namespaced_pod(namespace, {
            "metadata": {"name": name, "labels": {"trainhook.dev/job-name": "pi"}, "annotations": annotations or {}},
            "spec": {"hostname": hostname, "subdomain": "pi",
                     "containers": [{"name": c, "image": "registry.example/mpi:1"} for c in containers]}})


def test_with_the_gangs_role_the_exec_call_is_made_and_its_refusal_reported(
        control_plane, k8s_namespace, tmp_path):
    bind_gang_role(control_plane, k8s_namespace, ["pi-worker-0"])
    create_pod(control_plane, k8s_namespace, "pi-worker-0", "pi-worker-0")
    done = as_a_pod(control_plane, k8s_namespace, tmp_path, "-o", "ConnectionAttempts=10", "pi-worker-0.pi",
                    "orted", "-mca", "ess", '"env"')
    assert done.returncode == 255
    assert done.stderr.strip() == (
        f"trainhook-launch kubexec pi-worker-0.pi: cannot exec in pod {k8s_namespace}/pi-worker-0 (container mpi), "
        "phase Pending, no node: pod pi-worker-0 does not have a host assigned (HTTP 400)")
    # Scoped: another pod of the namespace is out of reach.
    create_pod(control_plane, k8s_namespace, "web-0", "web-0")
    other = as_a_pod(control_plane, k8s_namespace, tmp_path, "web-0.pi", "true")
    assert other.returncode == 255 and 'cannot get resource "pods"' in other.stderr


def test_a_job_pod_is_found_by_its_hostname_and_its_named_container_used(
        control_plane, k8s_namespace, tmp_path):
    bind_gang_role(control_plane, k8s_namespace, ["pi-worker-1-x7k2p"], list_pods=True)
    create_pod(control_plane, k8s_namespace, "pi-worker-1-x7k2p", "pi-worker-1", containers=("sidecar", "mpi"),
               annotations={"trainhook.dev/container": "mpi"})
    done = as_a_pod(control_plane, k8s_namespace, tmp_path, "pi-worker-1.pi", "--", "true",
                    TRAINHOOK_JOB_NAME="pi")
    assert done.returncode == 255
    assert (f"cannot exec in pod {k8s_namespace}/pi-worker-1-x7k2p (container mpi), phase Pending, no node: "
            "pod pi-worker-1-x7k2p does not have a host assigned (HTTP 400)") in done.stderr


def test_a_missing_pod_is_named(control_plane, k8s_namespace, tmp_path):
    bind_gang_role(control_plane, k8s_namespace, ["pi-worker-7"], list_pods=True)
    done = as_a_pod(control_plane, k8s_namespace, tmp_path, "pi-worker-7.pi", "true", TRAINHOOK_JOB_NAME="pi")
    assert done.returncode == 255
    assert done.stderr.strip() == (f"trainhook-launch kubexec pi-worker-7.pi: no pod 'pi-worker-7' in namespace "
                                   f"'{k8s_namespace}', and no pod of gang 'pi' with that hostname")


def test_without_a_role_the_agent_names_the_permission(control_plane, k8s_namespace, tmp_path):
    create_pod(control_plane, k8s_namespace, "pi-worker-0", "pi-worker-0")
    done = as_a_pod(control_plane, k8s_namespace, tmp_path, "pi-worker-0.pi", "true")
    assert done.returncode == 255
    assert (f'cannot read pod {k8s_namespace}/pi-worker-0: pods "pi-worker-0" is forbidden: User '
            f'"system:serviceaccount:{k8s_namespace}:default" cannot get resource "pods"') in done.stderr
    assert "which the chart no longer grants: bind a Role for this gang's pods" in done.stderr


def test_reading_pods_is_not_enough_to_exec(control_plane, k8s_namespace, tmp_path):
    with control_plane.api_client() as api:
        rbac = client.RbacAuthorizationV1Api(api)
        rbac.create_namespaced_role(k8s_namespace, {"metadata": {"name": "read-pods"}, "rules": [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]})
        rbac.create_namespaced_role_binding(k8s_namespace, {
            "metadata": {"name": "read-pods"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read-pods"},
            "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": k8s_namespace}]})
    create_pod(control_plane, k8s_namespace, "pi-worker-0", "pi-worker-0")
    done = as_a_pod(control_plane, k8s_namespace, tmp_path, "pi-worker-0.pi", "true")
    assert done.returncode == 255
    assert f"cannot exec in pod {k8s_namespace}/pi-worker-0 (container mpi)" in done.stderr
    assert 'cannot create resource "pods/exec"' in done.stderr or 'cannot get resource "pods/exec"' in done.stderr
