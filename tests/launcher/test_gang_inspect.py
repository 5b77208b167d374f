"""A finished gang can still be inspected (issue 25 item 2): what a member reports when its training ends, what the
coordinator sends with the outcome, what the notary records (bounded), and how `status` shows a gang whose pods are
gone. The record's annotations are always made by the notary's own writer (notary_records.record_patch), never by
hand; the last part runs real launchers against the real notary (tests/support/gang_notary.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from gang_notary import GangNotary, indexed_job
from webhook_process import free_port

from trainhook.cluster.status import format_list, format_status, gang_state, kept_lines
from trainhook.gang import keys
from trainhook.launcher.coordination.coordinator_rules import CoordinatorState
from trainhook.launcher.coordination.failure_cause import command_missing
from trainhook.launcher.coordination.report import EXITED, MAX_TAIL, STOPPED, Report
from trainhook.launcher.pod_view import GangView, Peer
from trainhook.launcher.policy import GangPolicy
from trainhook.webhook.notary.records import MAX_LINES, MAX_LINES_BYTES, BadBody, parse_outcome, rank_pods, record_patch

OUTCOME = {"phase": "Failed", "code": 3, "reason": "rank 1 (worker-1 at g-1.g) exited with 3", "rank": 1,
           "time": "2025-01-01T00:10:00Z", "attempt": 2, "restarts": 1, "started": "2025-01-01T00:00:00Z",
           "logs": {"1": "epoch 1\nTraceback (most recent call last):\nValueError: bad batch", "0": "epoch 1"}}


def recorded_sts(outcome: dict, pods: dict[int, str]) -> dict:
    """A finished gang's StatefulSet as the notary leaves it: scaled to zero, its template's shape kept, the
    record merged into its metadata."""
    patch = record_patch({**parse_outcome({"outcome": outcome}), "pod": pods.get(outcome["rank"], ""),
                          "pods": pods})["metadata"]
    labels = {keys.FRAMEWORK: "pytorch", keys.JOB_NAME: "g", keys.ROLE: "worker", **patch["labels"]}
    return {"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": "g", "labels": labels, "annotations": patch["annotations"]},
            "spec": {"replicas": 0, "template": {"metadata": {"annotations": {keys.REPLICAS: "worker=2"}}}}}


# --- status of a finished gang -------------------------------------------------------------------------------

def test_status_of_a_scaled_to_zero_gang_shows_its_record_and_its_real_shape():
    state = gang_state("g", "ns", [recorded_sts(OUTCOME, {1: "g-1", 0: "g-0"})], [])
    assert (state.outcome, state.shape, state.size) == ("Failed", "worker=2", 2)
    text = format_status(state)
    assert text.splitlines() == [
        "gang g (pytorch, worker=2) in ns: Failed (rank 1 (worker-1 at g-1.g) exited with 3 (exit 3) at "
        "2025-01-01T00:10:00Z)",
        "workloads: statefulset/g",
        "outcome: Failed, exit code 3, decided by rank 1 (pod g-1), attempt 2",
        "reason: rank 1 (worker-1 at g-1.g) exited with 3",
        "started: 2025-01-01T00:00:00Z  ended: 2025-01-01T00:10:00Z",
        "kept last lines: rank 0 (g-0), 1 lines, rank 1 (g-1), 3 lines",
        "no pods: the gang is finished (a StatefulSet gang is scaled to zero, which deletes its pods and their "
        "logs); `trainhook logs g` prints the kept last lines of rank 0 and rank 1"]
    assert "no pods yet" not in text and "worker=0" not in text
    (row,) = format_list([state]).splitlines()[1:]
    assert row.split() == ["g", "pytorch", "worker=2", "0/2", "0", "Failed"]


def test_a_scaled_to_zero_workload_without_a_template_shape_still_says_zero():
    workload = recorded_sts(OUTCOME, {})
    del workload["spec"]["template"]
    assert gang_state("g", "ns", [workload], []).shape == "worker=0"


def test_kept_lines_that_cannot_be_read_are_left_out_never_guessed():
    assert kept_lines("not json") == ()
    assert kept_lines(json.dumps([{"rank": "1", "lines": "x"}, {"rank": 0, "pod": "g-0", "lines": "ok"}])) == (
        kept_lines(json.dumps([{"rank": 0, "pod": "g-0", "lines": "ok"}])))


# --- what the notary accepts and records -------------------------------------------------------------------

def test_the_notary_keeps_only_the_deciding_ranks_and_rank_0s_lines_each_bounded():
    flood = "\n".join(f"line {i} " + "é" * 300 for i in range(500))
    outcome = parse_outcome({"outcome": {**OUTCOME, "logs": {"0": flood, "1": "a\x1b[0m\r", "2": "not kept"}}})
    assert sorted(outcome["logs"]) == [0, 1]
    assert outcome["logs"][1] == "a?[0m"
    kept = outcome["logs"][0].split("\n")
    assert len(kept) <= MAX_LINES and len(outcome["logs"][0].encode()) <= MAX_LINES_BYTES
    assert kept[-1].startswith("line 499 ")
    annotations = record_patch({**outcome, "pods": {0: "g-0", 1: "g-1"}})["metadata"]["annotations"]
    assert len(annotations[keys.LAST_LINES].encode()) < 9 * 1024 + 512
    assert (annotations[keys.PHASE_RANK], annotations[keys.ATTEMPTS], annotations[keys.START_TIME]) == (
        "1", "2", "2025-01-01T00:00:00Z")
    assert [(e["rank"], e["pod"]) for e in json.loads(annotations[keys.LAST_LINES])] == [(0, "g-0"), (1, "g-1")]


@pytest.mark.parametrize("field, value, fragment", [
    ("logs", ["a list"], "outcome.logs must be"),
    ("logs", {"one": "x"}, "outcome.logs must be"),
    ("logs", {"1": 5}, "outcome.logs must be"),
    ("started", "yesterday", "outcome.started='yesterday': RFC 3339"),
])
def test_malformed_details_are_refused_naming_the_field(field, value, fragment):
    with pytest.raises(BadBody) as refused:
        parse_outcome({"outcome": {**OUTCOME, field: value}})
    assert fragment in str(refused.value)


def test_ranks_are_named_by_the_gangs_own_pods_only():
    def pod(name: str, rank: int, owner: str) -> dict:
        return {"metadata": {"name": name, "ownerReferences": [{"controller": True, "uid": owner}]},
                "spec": {"containers": [{"env": [{"name": keys.TH_RANK, "value": str(rank)}]}]}}
    pods = [pod("job-0-abcde", 0, "u1"), pod("job-1-fghij", 1, "u1"), pod("look-alike", 1, "u1"),
            pod("stranger", 2, "other")]
    assert rank_pods(pods, {"u1"}) == {0: "job-0-abcde"}  # rank 1 is claimed twice: not named


# --- the member's report and the coordinator -----------------------------------------------------------------

def test_a_report_carries_a_bounded_tail_and_cause():
    body = Report(attempt=1, status=EXITED, code=127, tail="x", cause="command not found: torchrun").to_dict()
    assert Report.from_dict(body).tail == "x" and Report.from_dict(body).cause == "command not found: torchrun"
    assert "tail" not in Report(status=EXITED).to_dict()
    with pytest.raises(ValueError, match="tail must be text"):
        Report.from_dict({**body, "tail": "é" * MAX_TAIL})
    with pytest.raises(ValueError, match="cause must be text"):
        Report.from_dict({**body, "cause": 5})


def gang_state_of(size: int) -> CoordinatorState:
    peers = tuple(Peer("worker", i, i, f"g-{i}.g") for i in range(size))
    gang = GangView(framework="pytorch", job_name="g", namespace="ns", role="worker", index=0, rank=0, peers=peers,
                subdomain="g", address=peers[0].address, port=23456, gang_wait="dns", gang_wait_port=29499,
                wait_timeout=600.0)
    state = CoordinatorState(gang, GangPolicy(), now=1000.0)
    for rank in range(size):
        state.joined(rank, rank + 1, Report())
    return state


def test_the_coordinator_keeps_the_failing_members_tail_and_names_a_missing_command():
    state = gang_state_of(3)
    state.reported(2, 3, Report(attempt=1, status=EXITED, code=127, tail="bash: exec: torchrun: not found",
                                cause="command not found: torchrun"))
    assert state.outcome is not None and state.outcome.rank == 2
    assert "exited with 127" in state.outcome.reason and "command not found: torchrun" in state.outcome.reason
    assert state.tails == {2: "bash: exec: torchrun: not found"}
    # Members stopped because of the failure report their own ends: the failing rank's tail stays the one kept.
    state.reported(1, 2, Report(attempt=1, status=STOPPED, code=143, tail="stopped"))
    assert state.tails == {2: "bash: exec: torchrun: not found"}


@pytest.mark.parametrize("code, tail, cause", [
    (127, "bash: line 7: exec: torchrun: not found", "command not found: torchrun"),
    (127, "sh: 1: torchrun: command not found\n", "command not found: torchrun"),
    (127, "command not found: torchrun (the image has no torchrun on its PATH)", "command not found: torchrun"),
    (127, "exit 127 on purpose", ""),
    (1, "bash: torchrun: command not found", ""),
])
def test_a_missing_command_is_read_from_the_last_lines(code, tail, cause):
    assert command_missing(code, tail) == cause


# --- real launchers, the real notary ------------------------------------------------------------------------


def run_solo(notary: GangNotary, pod: dict, command: list[str], tmp_path) -> subprocess.CompletedProcess:
    env = {**notary.env(pod), "TRAINHOOK_COORDINATOR_PORT": str(free_port()), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", "trainhook.launcher.cli", "run", "--", *command],
                          capture_output=True, text=True, timeout=60, env=env)


def test_a_failed_gangs_record_keeps_its_last_lines_pod_attempts_and_times(tmp_path):
    program = "import sys\nfor i in range(60): print('step', i)\nprint('boom', file=sys.stderr)\nsys.exit(3)"
    with GangNotary(tmp_path / "run") as notary:
        [pod] = notary.admit(indexed_job("g", "ns"))
        done = run_solo(notary, pod, [sys.executable, "-u", "-c", program], tmp_path)  # -u: as PYTHONUNBUFFERED
        assert done.returncode == 3, done.stderr
        assert done.stdout.splitlines()[-1] == "step 59"  # the training's output still reaches the container
        annotations = notary.workload("ns", "Job", "g")["metadata"]["annotations"]
    assert annotations[keys.PHASE] == "Failed" and annotations[keys.EXIT_CODE] == "3"
    assert annotations[keys.PHASE_RANK] == "0" and annotations[keys.ATTEMPTS] == "1"
    assert annotations[keys.PHASE_POD] == pod["metadata"]["name"]  # the Job pod's generated name, from the notary
    assert annotations[keys.START_TIME] <= annotations[keys.PHASE_TIME]
    [kept] = json.loads(annotations[keys.LAST_LINES])
    assert (kept["rank"], kept["pod"]) == (0, pod["metadata"]["name"])
    lines = kept["lines"].splitlines()
    # each stream's order is kept; stdout's and stderr's lines interleave in the order the launcher read them
    assert "boom" in lines and len(lines) == 40
    assert [line for line in lines if line != "boom"] == [f"step {i}" for i in range(21, 60)]


def test_a_function_job_whose_image_lacks_torchrun_fails_naming_it(tmp_path):
    from trainhook.sdk.command import function_command

    def train():
        print("never runs")

    with GangNotary(tmp_path / "run") as notary:
        [pod] = notary.admit(indexed_job("g", "ns"))
        done = run_solo(notary, pod, function_command(train), tmp_path)  # PATH has bash, no torchrun
        assert done.returncode == 127, done.stderr
        annotations = notary.workload("ns", "Job", "g")["metadata"]["annotations"]
    assert "exited with 127" in annotations[keys.PHASE_REASON], annotations
    assert "command not found: torchrun" in annotations[keys.PHASE_REASON], annotations
