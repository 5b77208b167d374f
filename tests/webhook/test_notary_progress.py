"""A running gang's progress through the notary (webhook/notary/progress.py, docs/use/progress.md): what a body may
carry, what is written on the workload, who may write it and how often; then a real launcher forwarding what its
training writes to TRAINHOOK_PROGRESS_FILE to the real webhook's notary (tests/support/gang_notary.py)."""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from gang_notary import GangNotary, indexed_job
from webhook_process import free_port

from trainhook.gang import keys
from trainhook.webhook.notary.progress import Gate, parse_progress, progress_patch, recorded_progress
from trainhook.webhook.notary.records import BadBody


def test_a_body_is_normalized_as_the_launcher_does_and_bounded():
    detail = parse_progress({"progress": {"step": 5, "totalSteps": 10, "metrics": {"loss": 0.25, "x" * 80: 1},
                                          "time": "2026-01-01T00:00:00Z", "evil": "text"}})
    assert detail == {"percent": 50.0, "step": 5, "totalSteps": 10, "metrics": {"loss": 0.25},
                      "time": "2026-01-01T00:00:00Z"}


@pytest.mark.parametrize("body, fragment", [
    ({}, 'the body must be {"progress"'),
    ({"progress": [1]}, 'the body must be {"progress"'),
    ({"progress": {"step": "many"}}, "progress: step='many': a finite number is required"),
    ({"progress": {"note": "text only"}}, "no step, percent, epoch or numeric metric"),
])
def test_a_body_that_cannot_be_read_is_refused_naming_the_field(body, fragment):
    with pytest.raises(BadBody) as refused:
        parse_progress(body)
    assert fragment in str(refused.value)


def test_the_patch_writes_a_line_for_people_json_for_tools_and_a_label_for_kubectl_get_l():
    detail = parse_progress({"progress": {"step": 420, "totalSteps": 1000, "etaSeconds": 310,
                                          "metrics": {"loss": 0.5}}})
    patch = progress_patch(detail)["metadata"]
    assert patch["annotations"][keys.PROGRESS] == "42% (step 420/1000), loss=0.5, about 5m10s left"
    assert json.loads(patch["annotations"][keys.PROGRESS_DETAIL]) == detail
    assert patch["labels"] == {keys.PROGRESS: "42pct"}
    assert progress_patch(parse_progress({"progress": {"loss": 1}}))["metadata"]["labels"] == {keys.PROGRESS: None}
    workload = {"metadata": {"annotations": patch["annotations"]}}
    assert recorded_progress(workload) == {**detail, "summary": patch["annotations"][keys.PROGRESS]}
    assert recorded_progress({"metadata": {"annotations": {keys.PROGRESS_DETAIL: "{not json"}}}) is None
    assert recorded_progress(None) is None


def test_each_gang_is_written_at_most_once_per_interval():
    now = [0.0]
    gate = Gate(interval=4, clock=lambda: now[0])
    assert gate.wait("a") == 0 and gate.wait("b") == 0
    now[0] = 3
    assert gate.wait("a") == 1
    now[0] = 4
    assert gate.wait("a") == 0


# --- the real notary, a real launcher ------------------------------------------------------------------------

TRAINING = """
import json, os, time
with open(os.environ["TRAINHOOK_PROGRESS_FILE"], "a") as f:
    for step in (1, 2, 3, 4):
        f.write(json.dumps({"step": step, "total_steps": 4, "epoch": step / 2, "loss": 1.0 / step}) + "\\n")
        f.flush()
        time.sleep(0.7)
print("trained")
"""



def post_progress(notary: GangNotary, pod: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(notary.url + "/v1/progress", data=json.dumps(body).encode(), method="POST",
                                     headers={"Authorization": f"Bearer {notary.token_file(pod).read_text()}",
                                              "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, context=ssl.create_default_context(cadata=notary.ca_pem),
                                    timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def test_rank_0s_launcher_forwards_the_trainings_reports_and_the_last_lands_on_the_workload(tmp_path):
    with GangNotary(tmp_path / "run") as notary:
        [pod] = notary.admit(indexed_job("g", "ns"))
        env = {**notary.env(pod), "TRAINHOOK_COORDINATOR_PORT": str(free_port()), "PATH": "/usr/bin:/bin"}
        assert keys.TH_PROGRESS_FILE not in env  # the webhook injects nothing: the launcher gives it
        done = subprocess.run([sys.executable, "-m", "trainhook.launcher.cli", "run", "--", sys.executable, "-c",
                               TRAINING], capture_output=True, text=True, timeout=90, env=env)
        assert done.returncode == 0, done.stderr
        assert "trained" in done.stdout
        assert "progress not forwarded" not in done.stderr, done.stderr
        job = notary.workload("ns", "Job", "g")
    annotations, labels = job["metadata"]["annotations"], job["metadata"]["labels"]
    detail = json.loads(annotations[keys.PROGRESS_DETAIL])
    assert (detail["step"], detail["totalSteps"], detail["percent"], detail["epoch"]) == (4, 4, 100.0, 2.0)
    assert detail["metrics"] == {"loss": 0.25} and detail["time"].endswith("Z")
    assert annotations[keys.PROGRESS].startswith("100% (step 4/4, epoch 2), loss=0.25")
    assert labels[keys.PROGRESS] == "100pct"
    assert annotations[keys.PHASE] == "Succeeded"  # the outcome was recorded after the last report


def test_only_the_coordinator_may_report_and_no_faster_than_the_floor(tmp_path):
    with GangNotary(tmp_path / "run") as notary:
        rank0, rank1 = notary.admit(indexed_job("g", "ns", completions=2))
        status, answer = post_progress(notary, rank1["metadata"]["name"], {"progress": {"step": 1}})
        assert status == 403 and "only it may report the gang's progress" in answer["error"]
        status, answer = post_progress(notary, rank0["metadata"]["name"], {"progress": {"step": 1}})
        assert (status, answer["recorded"]) == (200, "Job/g")
        status, answer = post_progress(notary, rank0["metadata"]["name"], {"progress": {"step": 2}})
        assert status == 429 and "send the newest report in" in answer["error"]
        status, answer = post_progress(notary, rank0["metadata"]["name"], {"progress": {"step": "two"}})
        assert status == 400 and "step='two'" in answer["error"]
        job = notary.workload("ns", "Job", "g")
    assert json.loads(job["metadata"]["annotations"][keys.PROGRESS_DETAIL])["step"] == 1


def test_a_recorded_detail_that_is_not_json_or_nested_past_the_parsers_limit_is_no_progress():
    """Whoever may edit the workload can write its annotations: what the notary reads back never fails a call."""
    for text in ("not json", "[" * 5000, "[1]"):
        assert recorded_progress({"metadata": {"annotations": {keys.PROGRESS_DETAIL: text}}}) is None
