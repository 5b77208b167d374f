"""The launcher's outcome recording against the real Kubernetes 1.20 control plane (hack/cluster.py).

A real `trainhook-launch run` process plays rank 0 of a one-member StatefulSet gang, with the in-cluster
configuration a pod would have: KUBERNETES_SERVICE_HOST/PORT and a ServiceAccount's token and CA in the directory
TRAINHOOK_SERVICE_ACCOUNT_DIR names (the kubelet mounts them at /var/run/secrets/kubernetes.io/serviceaccount).
With the chart's training ClusterRole bound (rendered by Helm, as installed), it records the outcome on the
StatefulSet and scales it to zero, and the StatefulSet controller deletes the (Pending: no kubelet) pods. Without
the binding, the API answers 403 and the launcher parks, saying why.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from chart_render import find, render_chart
from helpers import wait_for
from conftest_cluster import (  # noqa: F401  (fixtures)
    control_plane,
    k8s_namespace,
    wait_for_service_account_token,
)
from trainhook.launcher.lifecycle import EXIT_CODE, PHASE, PHASE_REASON, PHASE_TIME

pytestmark = pytest.mark.cluster
NAME = "solo"




def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Launcher:
    """`trainhook-launch run -- CMD` as rank 0 (the only member) of the StatefulSet gang NAME, as a pod's
    ServiceAccount. Its stderr is collected line by line."""

    def __init__(self, plane, namespace: str, token: str, directory: Path, command: list[str]):
        sa = directory / "serviceaccount"
        sa.mkdir(parents=True, exist_ok=True)
        (sa / "token").write_text(token)
        (sa / "ca.crt").write_bytes(plane.ca_pem)
        (sa / "namespace").write_text(namespace)
        url = urlparse(plane.host)
        env = {"PATH": os.environ["PATH"], "HOME": str(directory),
               "KUBERNETES_SERVICE_HOST": url.hostname, "KUBERNETES_SERVICE_PORT": str(url.port),
               "TRAINHOOK_SERVICE_ACCOUNT_DIR": str(sa),
               "TRAINHOOK_FRAMEWORK": "pytorch", "TRAINHOOK_JOB_NAME": NAME, "TRAINHOOK_NAMESPACE": namespace,
               "TRAINHOOK_ROLE": "worker", "TRAINHOOK_INDEX": "0", "TRAINHOOK_RANK": "0",
               "TRAINHOOK_REPLICAS": "worker=1", "TRAINHOOK_HOSTS": f"worker={NAME}", "TRAINHOOK_SUBDOMAIN": NAME,
               "TRAINHOOK_GANG_TOKEN": "0" * 64, "TRAINHOOK_COORDINATOR_PORT": str(free_port()),
               "TRAINHOOK_WORKLOAD": f"StatefulSet/{NAME}", "TRAINHOOK_RESTART_POLICY": "Always"}
        self.proc = subprocess.Popen([sys.executable, "-m", "trainhook.launcher.cli", "run", "--", *command],
                                     env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def log(self) -> str:
        return "\n".join(self.lines)

    def wait_for_line(self, text: str, timeout: float = 60) -> str:
        return wait_for(f"{text!r} in the launcher's log:\n{self.log}",
                        lambda: next((line for line in self.lines if text in line), None), timeout)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


@pytest.fixture
def gang_workload(control_plane, k8s_namespace):  # noqa: F811
    """A 2-replica StatefulSet (its pods stay Pending) and the ServiceAccounts `trainer` (bound to the chart's
    training ClusterRole, rendered by Helm with trainingServiceAccounts) and `nobody` (bound to nothing)."""
    ns = k8s_namespace
    manifests = render_chart({"fullnameOverride": f"th-{ns}",
                              "trainingServiceAccounts": [{"namespace": ns, "name": "trainer"}]})
    role = find(manifests, "ClusterRole", f"th-{ns}-training")
    binding = find(manifests, "RoleBinding", f"th-{ns}-training-trainer")
    with control_plane.api_client() as api:
        core, apps, rbac = client.CoreV1Api(api), client.AppsV1Api(api), client.RbacAuthorizationV1Api(api)
        rbac.create_cluster_role(role)
        rbac.create_namespaced_role_binding(ns, binding)
        tokens = {}
        for sa in ("trainer", "nobody"):
            core.create_namespaced_service_account(ns, {"metadata": {"name": sa}})
            tokens[sa] = wait_for_service_account_token(api, ns, sa)
        labels = {"app": NAME}
        apps.create_namespaced_stateful_set(ns, {
            "metadata": {"name": NAME, "labels": {"trainhook.dev/framework": "pytorch"}},
            "spec": {"replicas": 2, "serviceName": NAME, "podManagementPolicy": "Parallel",
                     "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [{"name": "trainer", "image": "registry.example/t:1"}]}}},
        })
        wait_for("the StatefulSet's pods", lambda: len(core.list_namespaced_pod(ns).items) == 2)
        try:
            yield api, ns, tokens
        finally:
            try:
                rbac.delete_cluster_role(role["metadata"]["name"])
            except ApiException:
                pass


@pytest.mark.parametrize("code, phase", [(0, "Succeeded"), (3, "Failed")])
def test_with_the_chart_role_the_launcher_records_the_phase_and_scales_the_statefulset_to_zero(
        control_plane, gang_workload, tmp_path, code, phase):  # noqa: F811
    api, ns, tokens = gang_workload
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    launcher = Launcher(control_plane, ns, tokens["trainer"], tmp_path,
                        [sys.executable, "-c", f"print('training'); raise SystemExit({code})"])
    try:
        launcher.wait_for_line("parked:")
        assert f"recorded the outcome on StatefulSet/{NAME}: {phase}" in launcher.log
        assert f"scaled StatefulSet/{NAME} to zero: its controller deletes the gang's pods" in launcher.log
        assert f"StatefulSet/{NAME} is scaled to zero, so its pods are deleted shortly" in launcher.log
        sts = apps.read_namespaced_stateful_set(NAME, ns)
        assert sts.spec.replicas == 0
        annotations = sts.metadata.annotations
        assert annotations[PHASE] == phase and annotations[EXIT_CODE] == str(code)
        assert annotations[PHASE_REASON] == (f"rank 0 (worker-0 at {NAME}-0.{NAME}) exited "
                                             + ("0" if code == 0 else f"with {code}"))
        assert annotations[PHASE_TIME].endswith("Z")
        wait_for("the StatefulSet controller to delete the pods", lambda: not core.list_namespaced_pod(ns).items)
    finally:
        assert launcher.stop() == code, launcher.log

    # A container restarted after that (or a pod recreated) reads the recorded outcome and never trains again.
    marker = tmp_path / "trained-again"
    again = Launcher(control_plane, ns, tokens["trainer"], tmp_path / "again",
                     [sys.executable, "-c", f"open({str(marker)!r}, 'w')"])
    try:
        again.wait_for_line("parked:")
        assert f"StatefulSet/{NAME} records that the gang is done ({phase}" in again.log
        assert "kubectl annotate statefulset solo trainhook.dev/phase-" in again.log
        assert "not running the training" in again.log
    finally:
        again.stop()
    assert not marker.exists()


def test_without_the_role_the_launcher_gets_403_and_parks_saying_why(control_plane, gang_workload,
                                                                       tmp_path):  # noqa: F811
    api, ns, tokens = gang_workload
    launcher = Launcher(control_plane, ns, tokens["nobody"], tmp_path, [sys.executable, "-c", "print('training')"])
    try:
        line = launcher.wait_for_line("parked:")
        assert (f"the outcome is not recorded on StatefulSet/{NAME} and it is not scaled to zero: cannot record the "
                f"outcome on StatefulSet/{NAME}: statefulsets.apps \"{NAME}\" is forbidden: User "
                f"\"system:serviceaccount:{ns}:nobody\" cannot patch resource \"statefulsets\"") in line
        assert "(HTTP 403): bind the pod's ServiceAccount to the chart's training ClusterRole" in line
        # reading the recorded outcome at start was refused too, and said so
        assert "could not read the outcome recorded on StatefulSet/solo" in launcher.log
        sts = client.AppsV1Api(api).read_namespaced_stateful_set(NAME, ns)
        assert sts.spec.replicas == 2 and PHASE not in (sts.metadata.annotations or {})
        time.sleep(1)
        assert launcher.proc.poll() is None  # parked, not exited (its container would rerun the training)
    finally:
        assert launcher.stop() == 0, launcher.log
