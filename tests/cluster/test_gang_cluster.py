"""The launcher's outcome recording against the real Kubernetes 1.20 control plane (hack/cluster.py), through the
notary (docs/operate/security.md).

A real `trainhook-launch run` process plays rank 0 of a one-member StatefulSet gang. Like a training pod it holds no
Kubernetes permission: no ServiceAccount token of the API's audience, no KUBERNETES_SERVICE_HOST; only its pod's
projected identity token (a real pod-bound token from the TokenRequest API, audience `trainhook`) and the notary's
URL and CA. The notary (the webhook's console script with `--notary-authority cluster`: test_notary_cluster's
module fixture) verifies the token with a real TokenReview, gives the launcher its gang's key, and records the
outcome the launcher posts on the StatefulSet and scales it to zero; the StatefulSet controller then deletes the
(Pending: no kubelet) pods. A launcher whose pod is not a member gets no key and says why.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from helpers import wait_for
from kubernetes import client
from test_notary_cluster import create_gang, imposter_pod, pod_token, scale_up_again
from webhook_process import free_port

from trainhook.launcher.outcome import EXIT_CODE, PHASE, PHASE_REASON, PHASE_TIME

pytestmark = pytest.mark.cluster
NAME = "solo"



class Launcher:
    """`trainhook-launch run -- CMD` as rank 0 (the only member) of the StatefulSet gang NAME, with pod `pod`'s
    identity token and the notary the webhook would inject. Its stderr is collected line by line."""

    def __init__(self, notary_hook, api, namespace: str, pod: str, directory: Path, command: list[str],
                 **more: str):
        directory.mkdir(parents=True, exist_ok=True)
        token = directory / "identity-token"
        token.write_text(pod_token(api, namespace, pod))
        env = {"PATH": os.environ["PATH"], "HOME": str(directory),
               "TRAINHOOK_FRAMEWORK": "pytorch", "TRAINHOOK_JOB_NAME": NAME, "TRAINHOOK_NAMESPACE": namespace,
               "TRAINHOOK_ROLE": "worker", "TRAINHOOK_INDEX": "0", "TRAINHOOK_RANK": "0",
               "TRAINHOOK_REPLICAS": "worker=1", "TRAINHOOK_HOSTS": f"worker={NAME}", "TRAINHOOK_SUBDOMAIN": NAME,
               "TRAINHOOK_COORDINATOR_PORT": str(free_port()), "TRAINHOOK_STATE_DIR": str(directory / "state"),
               "TRAINHOOK_WORKLOAD": f"StatefulSet/{NAME}", "TRAINHOOK_RESTART_POLICY": "Always",
               "TRAINHOOK_NOTARY": notary_hook.notary_url, "TRAINHOOK_NOTARY_CA": notary_hook.ca_file.read_text(),
               "TRAINHOOK_IDENTITY_TOKEN": str(token), **more}
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
        """The first line with `text`; a failure shows the log as it is at the deadline, not as it was at the call."""
        try:
            return wait_for(f"{text!r} in the launcher's log",
                            lambda: next((line for line in self.lines if text in line), None), timeout)
        except AssertionError as e:
            raise AssertionError(f"{e}:\n{self.log}") from None

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


@pytest.mark.parametrize("code, phase", [(0, "Succeeded"), (3, "Failed")])
def test_the_notary_records_the_launchers_outcome_and_scales_the_statefulset_to_zero(
        notary, control_plane, k8s_namespace, tmp_path, code, phase):
    api = control_plane.api_client()
    ns = k8s_namespace
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    create_gang(api, ns, NAME, replicas=1)
    launcher = Launcher(notary, api, ns, f"{NAME}-0", tmp_path,
                        [sys.executable, "-c", f"print('training'); raise SystemExit({code})"])
    try:
        launcher.wait_for_line("parked:")
        assert f"the notary recorded the outcome: {phase}" in launcher.log
        assert (f"the notary recorded {phase} on the gang's workloads and stops it (a StatefulSet is scaled to "
                "zero)") in launcher.log
        sts = apps.read_namespaced_stateful_set(NAME, ns)
        assert sts.spec.replicas == 0
        annotations = sts.metadata.annotations
        assert annotations[PHASE] == phase and annotations[EXIT_CODE] == str(code)
        assert sts.metadata.labels[PHASE] == phase
        assert annotations[PHASE_REASON] == (f"rank 0 (worker-0 at {NAME}-0.{NAME}) exited "
                                             + ("0" if code == 0 else f"with {code}"))
        assert annotations[PHASE_TIME].endswith("Z")
        events = [e for e in core.list_namespaced_event(ns).items if e.source.component == "trainhook-notary"]
        assert [e.reason for e in events] == ["GangSucceeded" if code == 0 else "GangFailed"]
        wait_for("the StatefulSet controller to delete the pods", lambda: not core.list_namespaced_pod(ns).items)
    finally:
        assert launcher.stop() == code, launcher.log


def test_a_restarted_coordinator_learns_the_outcome_from_the_notary_and_does_not_train(
        notary, control_plane, k8s_namespace, tmp_path):
    """A container restarted after the record (its state directory gone: a pod replaced) asks the notary."""
    api = control_plane.api_client()
    create_gang(api, k8s_namespace, NAME, replicas=1)
    first = Launcher(notary, api, k8s_namespace, f"{NAME}-0", tmp_path / "first",
                     [sys.executable, "-c", "raise SystemExit(3)"])
    try:
        first.wait_for_line("parked:")
    finally:
        first.stop()
    scale_up_again(api, k8s_namespace, NAME, 1)  # a new pod solo-0: the identity token below is bound to it
    marker = tmp_path / "trained-again"
    again = Launcher(notary, api, k8s_namespace, f"{NAME}-0", tmp_path / "again",
                     [sys.executable, "-c", f"open({str(marker)!r}, 'w')"])
    try:
        again.wait_for_line("parked:")
        assert "not running the training" in again.log, again.log
    finally:
        again.stop()
    assert not marker.exists()


def test_a_launcher_whose_pod_is_not_a_member_gets_no_key_and_says_why(notary, control_plane, k8s_namespace,
                                                                       tmp_path):
    """A bare pod copying the gang's labels in rank 1's place (at rank 0 it would be a bare-Pod gang of its own,
    with another key: test_notary_cluster.py) runs the launcher: 403 until the deadline, then it gives up."""
    api = control_plane.api_client()
    create_gang(api, k8s_namespace, NAME, replicas=1)
    client.CoreV1Api(api).create_namespaced_pod(k8s_namespace, imposter_pod(NAME, 1, "imposter"))
    marker = tmp_path / "trained"
    launcher = Launcher(notary, api, k8s_namespace, "imposter", tmp_path,
                        [sys.executable, "-c", f"open({str(marker)!r}, 'w')"], TRAINHOOK_WAIT_TIMEOUT="5")
    try:
        code = launcher.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the launcher did not give up:\n{launcher.log}") from None
    finally:
        launcher.stop()
    assert code != 0 and not marker.exists(), launcher.log
    assert "HTTP 403" in launcher.log and "imposter" in launcher.log, launcher.log
    sts = client.AppsV1Api(api).read_namespaced_stateful_set(NAME, k8s_namespace)
    assert sts.spec.replicas == 1 and PHASE not in (sts.metadata.annotations or {})
