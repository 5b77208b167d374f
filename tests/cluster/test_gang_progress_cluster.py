"""A gang's progress on the real Kubernetes 1.20 control plane (issue 33): a real `trainhook-launch run` process plays
rank 0 of a StatefulSet gang (tests/cluster/test_gang_cluster.py's Launcher: only its pod's projected identity token,
no Kubernetes permission), its training appends reports to TRAINHOOK_PROGRESS_FILE, and the real notary (the webhook's
console script, `--notary-authority cluster`) writes them on the StatefulSet; then `kubectl get -L`'s label, `trainhook
status`, `trainhook list -A -l -o json` and the SDK's get_job read them back through the real API server. And the
follower of a gang's logs waits for every member's pod, created one by one (get_job_logs(follow=True) right after
create_job missed the last rank). And the notary's gang metrics, scraped from the webhook's /metrics after real
launchers' gangs succeed, fail and restart."""

from __future__ import annotations

import json
import ssl
import sys
import threading
import time
import urllib.request

import pytest
from kubernetes import client

from test_gang_cluster import NAME, Launcher
from test_notary_cluster import create_gang

from trainhook.cli import main
from trainhook.cluster.client import Cluster
from trainhook.cluster.logs import wait_for_pods
from trainhook.gang import keys
from trainhook.sdk import TrainingClient

pytestmark = pytest.mark.cluster

TRAINING = """
import json, os, time
with open(os.environ["TRAINHOOK_PROGRESS_FILE"], "a") as f:
    for step in range(1, 6):
        f.write(json.dumps({"step": step * 20, "total_steps": 100, "loss": 1.0 / step}) + "\\n")
        f.flush()
        time.sleep(0.5)
"""


def test_a_launchers_progress_is_recorded_on_the_workload_and_read_by_kubectl_status_list_and_the_sdk(
        notary, control_plane, k8s_namespace, tmp_path, capsys):
    api = control_plane.api_client()
    ns = k8s_namespace
    create_gang(api, ns, NAME, replicas=1)
    apps = client.AppsV1Api(api)
    apps.patch_namespaced_stateful_set(NAME, ns, {"metadata": {"labels": {"team": "vision"}}})
    launcher = Launcher(notary, api, ns, f"{NAME}-0", tmp_path, [sys.executable, "-c", TRAINING])
    try:
        launcher.wait_for_line("parked:")
    finally:
        assert launcher.stop() == 0, launcher.log
    assert "progress not forwarded" not in launcher.log, launcher.log
    sts = apps.read_namespaced_stateful_set(NAME, ns)
    assert sts.metadata.labels[keys.PROGRESS] == "100pct"  # kubectl get sts -L trainhook.dev/progress
    assert sts.metadata.annotations[keys.PROGRESS] == "100% (step 100/100), loss=0.2"
    assert json.loads(sts.metadata.annotations[keys.PROGRESS_DETAIL])["step"] == 100

    kube = ["--kubeconfig", str(control_plane.kubeconfig)]
    assert main(["status", NAME, "-n", ns, *kube]) == 0
    status = capsys.readouterr().out.splitlines()
    assert any(line.startswith("progress: 100% (step 100/100), loss=0.2 (reported ") for line in status), status
    assert "last metrics: loss=0.2" in status
    assert main(["list", "-A", "-l", "team=vision", "-o", "json", *kube]) == 0
    items = json.loads(capsys.readouterr().out)["items"]
    assert [(i["namespace"], i["name"], i["outcome"], i["progress"]["percent"]) for i in items] == [
        (ns, NAME, "Succeeded", 100.0)]
    assert main(["list", "-A", "-l", "team=audio", *kube]) == 0
    assert capsys.readouterr().out.strip() == "no gangs"
    with TrainingClient(config_file=str(control_plane.kubeconfig), namespace=ns) as sdk:
        job = sdk.get_job(NAME)
    assert job.progress["step"] == 100 and job.progress["metrics"] == {"loss": 0.2}


def bare_pod(name: str, index: int) -> dict:
    """A bare-Pod gang's member as the webhook leaves it (its rank and shape in its environment), and as a user
    writes it (index and shape), so the module's registered webhook admits it too."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{name}-{index}", "labels": {keys.JOB_NAME: name, keys.FRAMEWORK: "pytorch",
                                                               keys.INDEX: str(index)},
                         "annotations": {keys.REPLICAS: "worker=3"}},
            "spec": {"containers": [{"name": "trainer", "image": "busybox", "command": ["true"],
                                     "env": [{"name": keys.TH_RANK, "value": str(index)},
                                             {"name": keys.TH_REPLICAS, "value": "worker=3"}]}]}}


def test_a_log_follower_waits_for_every_members_pod_not_the_first(control_plane, k8s_namespace):
    core = client.CoreV1Api(control_plane.api_client())
    core.create_namespaced_pod(k8s_namespace, bare_pod("g", 0))

    def the_others_later() -> None:
        for index in (1, 2):
            time.sleep(1.5)
            core.create_namespaced_pod(k8s_namespace, bare_pod("g", index))

    later = threading.Thread(target=the_others_later)
    later.start()
    cluster = Cluster(control_plane.api_client(), k8s_namespace)
    try:
        state, pods = wait_for_pods(cluster, "g", timeout=30)
    finally:
        later.join()
        cluster.close()
    assert state.size == 3
    assert sorted(p["metadata"]["name"] for p in pods) == ["g-0", "g-1", "g-2"]


def scrape(hook) -> dict[tuple[str, tuple], float]:
    """Every sample of the webhook's /metrics (its admission port, as the chart's ServiceMonitor scrapes it), read
    by prometheus_client's own text parser: {(name, sorted labels): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    context = ssl.create_default_context(cafile=str(hook.ca_file))
    with urllib.request.urlopen(hook.url + "/metrics", context=context, timeout=10) as answer:
        text = answer.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_gangs_that_succeed_fail_and_restart_are_counted_in_the_webhooks_metrics(
        notary, control_plane, k8s_namespace, tmp_path):
    api = control_plane.api_client()
    ns = k8s_namespace
    restart_on_kill = ("import os, signal\nif os.environ['TRAINHOOK_ATTEMPT'] == '1': "
                       "os.kill(os.getpid(), signal.SIGKILL)")
    runs = [("good", "print('ok')", 0, {}), ("bad", "raise SystemExit(3)", 3, {}),
            ("again", restart_on_kill, 0, {"TRAINHOOK_ON_FAILURE": "restart-gang", "TRAINHOOK_MAX_RESTARTS": "2"})]
    for job, program, code, more in runs:
        create_gang(api, ns, job, replicas=1)
        launcher = Launcher(notary, api, ns, f"{job}-0", tmp_path / job, [sys.executable, "-c", program],
                            TRAINHOOK_JOB_NAME=job, TRAINHOOK_HOSTS=f"worker={job}", TRAINHOOK_SUBDOMAIN=job,
                            TRAINHOOK_WORKLOAD=f"StatefulSet/{job}", **more)
        try:
            launcher.wait_for_line("parked:")
        finally:
            assert launcher.stop() == code, launcher.log
    samples = scrape(notary)
    gang = (("framework", "pytorch"), ("namespace", ns))
    assert samples[("trainhook_gangs_started_total", gang)] == 3
    assert samples[("trainhook_gangs_succeeded_total", gang)] == 2
    assert samples[("trainhook_gangs_failed_total", gang)] == 1
    assert samples[("trainhook_gangs_restarted_total", gang)] == 1
    assert samples[("trainhook_gangs_running", gang)] == 0
    assert samples[("trainhook_gang_start_seconds_count", (("framework", "pytorch"),))] >= 3
    assert samples[("trainhook_gang_duration_seconds_count", (("framework", "pytorch"), ("phase", "Failed")))] >= 1
    assert samples[("trainhook_notary_requests_total", (("call", "/v1/credential"), ("code", "200")))] >= 3
    assert samples[("trainhook_notary_request_seconds_count", (("call", "/v1/outcome"),))] >= 3
