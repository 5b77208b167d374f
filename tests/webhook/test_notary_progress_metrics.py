"""The gang metrics the notary exports (webhook/notary/metrics.py, docs/operate/metrics.md), scraped from the real
webhook's /metrics with prometheus_client's own text parser after real launchers' gangs succeed, fail and restart
through the real notary (tests/support/gang_notary.py: the webhook process, its notary over a local authority)."""

from __future__ import annotations

import ssl
import subprocess
import sys
import time
import urllib.request

from gang_notary import GangNotary, indexed_job
from prometheus_client.parser import text_string_to_metric_families
from webhook_process import free_port

from trainhook.webhook.notary.metrics import NotaryMetrics


def run_gang(notary: GangNotary, job: str, program: str, **env: str) -> subprocess.CompletedProcess:
    workload = indexed_job(job, "team-a")
    workload["metadata"]["creationTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())  # as stored
    [pod] = notary.admit(workload)
    env = {**notary.env(pod), "TRAINHOOK_COORDINATOR_PORT": str(free_port()), "PATH": "/usr/bin:/bin", **env}
    return subprocess.run([sys.executable, "-m", "trainhook.launcher.cli", "run", "--", sys.executable, "-c",
                           program], capture_output=True, text=True, timeout=90, env=env)


def scrape(notary: GangNotary) -> dict[tuple[str, tuple], float]:
    """Every sample of the webhook's /metrics: {(name, sorted labels): value}."""
    context = ssl.create_default_context(cafile=str(notary.server.ca_file))
    with urllib.request.urlopen(f"https://127.0.0.1:{notary.server.port}/metrics", context=context,
                                timeout=10) as answer:
        text = answer.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


GANG = (("framework", "pytorch"), ("namespace", "team-a"))


def test_gangs_that_succeed_fail_and_restart_are_counted_by_namespace_and_framework(tmp_path):
    with GangNotary(tmp_path / "run") as notary:
        assert run_gang(notary, "good", "print('ok')").returncode == 0
        assert run_gang(notary, "bad", "raise SystemExit(3)").returncode == 3
        again = run_gang(notary, "again", "import os, signal\nif os.environ['TRAINHOOK_ATTEMPT'] == '1': "
                                          "os.kill(os.getpid(), signal.SIGKILL)",
                         TRAINHOOK_ON_FAILURE="restart-gang", TRAINHOOK_MAX_RESTARTS="2")
        assert again.returncode == 0, again.stderr
        samples = scrape(notary)
    assert samples[("trainhook_gangs_started_total", GANG)] == 3
    assert samples[("trainhook_gangs_succeeded_total", GANG)] == 2
    assert samples[("trainhook_gangs_failed_total", GANG)] == 1
    assert samples[("trainhook_gangs_restarted_total", GANG)] == 1
    assert samples[("trainhook_gangs_running", GANG)] == 0
    assert samples[("trainhook_gang_start_seconds_count", (("framework", "pytorch"),))] == 3
    assert 0 <= samples[("trainhook_gang_start_seconds_sum", (("framework", "pytorch"),))] < 60
    assert samples[("trainhook_gang_duration_seconds_count", (("framework", "pytorch"), ("phase", "Succeeded")))] == 2
    assert samples[("trainhook_gang_duration_seconds_count", (("framework", "pytorch"), ("phase", "Failed")))] == 1
    assert samples[("trainhook_notary_requests_total", (("call", "/v1/credential"), ("code", "200")))] == 3
    assert samples[("trainhook_notary_requests_total", (("call", "/v1/outcome"), ("code", "200")))] >= 3
    assert samples[("trainhook_notary_request_seconds_count", (("call", "/v1/event"),))] >= 1
    assert ("trainhook_admissions_total", (("kind", "Job"), ("outcome", "mutated"))) in samples  # one /metrics


def test_a_gang_counts_once_however_often_rank_0_asks_and_its_progress_gauge_leaves_with_it():
    now = [1000.0]
    metrics = NotaryMetrics(clock=lambda: now[0])
    for _ in range(3):  # a restarted rank 0 container asks for its key again
        metrics.gang_started("ns/g/u1", "ns", "g", "pytorch", "1970-01-01T00:16:30Z")
    metrics.gang_progress("ns/g/u1", "ns", "g", "pytorch", {"percent": 40.0})
    text = scrape_registry(metrics)
    assert text[("trainhook_gangs_started_total", (("framework", "pytorch"), ("namespace", "ns")))] == 1
    assert text[("trainhook_gang_start_seconds_sum", (("framework", "pytorch"),))] == 10.0
    assert text[("trainhook_gang_progress_percent", (("job", "g"), ("namespace", "ns")))] == 40.0
    outcome = {"phase": "Failed", "started": "1970-01-01T00:16:40Z", "time": "1970-01-01T00:17:40Z"}
    for _ in range(2):  # a retried record
        metrics.gang_finished("ns/g/u1", "ns", "g", "pytorch", outcome)
    text = scrape_registry(metrics)
    assert text[("trainhook_gangs_failed_total", (("framework", "pytorch"), ("namespace", "ns")))] == 1
    assert text[("trainhook_gangs_running", (("framework", "pytorch"), ("namespace", "ns")))] == 0
    assert text[("trainhook_gang_duration_seconds_sum", (("framework", "pytorch"), ("phase", "Failed")))] == 60.0
    assert not any(name == "trainhook_gang_progress_percent" for name, _ in text)
    metrics.answered("/no/such/call", 404, 0.01)
    assert scrape_registry(metrics)[("trainhook_notary_requests_total", (("call", "other"), ("code", "404")))] == 1


def scrape_registry(metrics: NotaryMetrics) -> dict[tuple[str, tuple], float]:
    from prometheus_client import generate_latest
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(generate_latest(metrics.registry).decode())
            for s in family.samples}
