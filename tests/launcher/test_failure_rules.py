"""Failure rules (issue 25 item 1): which failures restart the gang and which fail it at once, what torchrun's exit
1 hides, and the outcome naming the rule that decided.

The parsing and the coordinator's decisions are pure; what torchrun reports is taken from real torchrun runs
(torch is installed here); the annotation's refusal goes through the real webhook over HTTPS; and a one-member
Job gang runs real `trainhook-launch run -- torchrun` processes against the real notary (tests/support/gang_notary.py).
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from gang_notary import GangNotary, indexed_job
from objects import review, statefulset
from webhook_process import free_port

from trainhook.launcher.coordination import failure_cause
from trainhook.launcher.coordination.coordinator_rules import CoordinatorState
from trainhook.launcher.coordination.report import EXITED, STOPPED, Report
from trainhook.gang.failure_rules import DEFAULT_TEXT, FailureRules, RulesError, parse
from trainhook.launcher.pod_view import ConfigError, GangView, Peer
from trainhook.launcher.policy import RESTART_GANG, GangPolicy, read_settings

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
# A worker that fails one way on attempt 1 (TRAINHOOK_ATTEMPT, which torchrun passes on) in local rank 1, then works.
WORKER = """import os, signal, sys, time
first = os.environ.get("TRAINHOOK_ATTEMPT", "1") == "1" and os.environ["LOCAL_RANK"] == "1"
open(sys.argv[2], "a").write(os.environ.get("TRAINHOOK_ATTEMPT", "?") + os.environ["LOCAL_RANK"] + "\\n")
if first and sys.argv[1] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
if sys.argv[1] == "exit3" and os.environ["LOCAL_RANK"] == "1":
    sys.exit(3)
time.sleep(1 if first else 0.2)
"""


# --- the rules ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("code, symptom, action, words", [
    (137, "", "restart-gang", "rule restart-gang: signals (default)"),
    (143, "", "restart-gang", "rule restart-gang: signals (default)"),
    (1, "lost-peer", "restart-gang", "rule restart-gang: lost-peer (default)"),
    (1, "timeout", "restart-gang", "rule restart-gang: timeout (default)"),
    (3, "", "fail-gang", "rule fail-gang: 1-127 (default)"),
    (1, "", "fail-gang", "rule fail-gang: 1-127 (default)"),
])
def test_the_default_retries_signals_lost_peers_and_timeouts_and_fails_the_programs_own_exits(code, symptom,
                                                                                             action, words):
    decision = FailureRules().decide(code, symptom)
    assert (decision.action, decision.words()) == (action, words)


def test_the_users_rules_come_first_in_order_and_the_default_catches_the_rest():
    rules = FailureRules.from_text("fail-gang: SIGKILL, 42; restart-gang: 1-3, sigsegv; fail-gang: signals")
    assert rules.decide(137).words() == "rule fail-gang: SIGKILL (trainhook.dev/failure-rules)"
    assert rules.decide(2).words() == "rule restart-gang: 1-3 (trainhook.dev/failure-rules)"
    assert rules.decide(139).action == "restart-gang"  # SIGSEGV named before `signals`
    assert rules.decide(143).words() == "rule fail-gang: signals (trainhook.dev/failure-rules)"
    assert rules.decide(1, "lost-peer").action == "restart-gang"  # 1-3 matched first
    assert rules.decide(9, "lost-peer").words() == "rule restart-gang: lost-peer (default)"
    assert rules.decide(9).words() == "rule fail-gang: 1-127 (default)"
    assert len(parse(DEFAULT_TEXT)) == 2


@pytest.mark.parametrize("text, message", [
    ("retry: 137", "does not start with restart-gang: or fail-gang:"),
    ("restart-gang 137", "does not start with"),
    ("restart-gang:", "names no exit code"),
    ("fail-gang: 0", "exit codes run from 1 to 255"),
    ("fail-gang: 300", "exit codes run from 1 to 255"),
    ("fail-gang: 9-3", "low to high"),
    ("restart-gang: SIGNOPE", "'SIGNOPE' is not a signal name"),
    ("restart-gang: oom", "'oom' is not an exit code, a range"),
    (" ; ", "no rule"),
])
def test_malformed_rules_are_refused_saying_what_is_wrong(text, message):
    with pytest.raises(RulesError, match=message):
        parse(text)


# --- the coordinator's decision -----------------------------------------------------------------------------------

def gang_state(rules: str = "", settle: float = 3.0, size: int = 3) -> CoordinatorState:
    peers = tuple(Peer("worker", i, i, f"w-{i}.g") for i in range(size))
    gang = GangView(framework="pytorch", job_name="g", namespace="ns", role="worker", index=0, rank=0, peers=peers,
                subdomain="g", address=peers[0].address, port=23456, gang_wait="dns", gang_wait_port=29499,
                wait_timeout=600.0)
    policy = GangPolicy(RESTART_GANG, 3, rules=FailureRules.from_text(rules), settle=settle)
    state = CoordinatorState(gang, policy, now=1000.0)
    for rank in range(size):
        state.joined(rank, rank + 1, Report())
    state.outbox.clear()
    state.log.clear()
    return state


def exit_report(state: CoordinatorState, rank: int, code: int, symptom: str = "", cause: str = "",
                status: str = EXITED) -> None:
    state.reported(rank, rank + 1, Report(attempt=state.attempt, status=status, code=code, restarts=state.restarts,
                                          since=state.since, cause=cause, symptom=symptom))


def test_a_worker_killed_under_torchrun_restarts_the_gang_and_the_log_names_the_rule():
    state = gang_state()
    exit_report(state, 1, 137, cause="torchrun: local rank 0's worker was killed by SIGKILL")
    assert state.outcome is None and state.restarts == 1 and state.phase == "restarting"
    assert state.log[0] == ("rank 1 (worker-1 at w-1.g) exited with 137 (SIGKILL) (torchrun: local rank 0's worker "
                            "was killed by SIGKILL); rule restart-gang: signals (default) retries it: restarting the "
                            "gang (restart 1 of 3); stopping every member's training")
    assert "rule restart-gang: signals (default) retries it" in state.events[0][2]


def test_an_exit_code_the_user_named_fatal_fails_at_once_with_no_restart():
    state = gang_state("fail-gang: 3; restart-gang: 1-127")
    exit_report(state, 2, 3)
    assert state.outcome is not None and state.restarts == 0  # no settling: the user said so
    assert (state.outcome.code, state.outcome.rank) == (3, 2)
    assert state.outcome.reason == ("rank 2 (worker-2 at w-2.g) exited with 3; rule fail-gang: 3 "
                                    "(trainhook.dev/failure-rules) makes it fatal")
    assert sorted(rank for rank, body in state.outbox if body["type"] == "done") == [0, 1, 2]


def test_a_lost_peer_is_retried_and_a_fatal_exit_by_default_waits_for_a_signal_that_caused_it():
    state = gang_state()
    exit_report(state, 0, 1, symptom="lost-peer", cause="RuntimeError: Connection closed by peer")
    assert state.restarts == 1 and "rule restart-gang: lost-peer (default) retries it" in state.log[0]
    # Attempt 2: rank 0's peer was killed, and rank 0's plain exit 1 (nothing recognized) arrives first.
    for rank in range(3):
        exit_report(state, rank, 143, status=STOPPED)
    assert state.attempt == 2
    exit_report(state, 0, 1)
    assert state.outcome is None and "failing the gang in 3s unless a member's death by a signal" in state.log[-1]
    exit_report(state, 2, 1, symptom="lost-peer")  # another consequence: no news
    exit_report(state, 1, 137)
    assert state.outcome is None and state.restarts == 2  # the killed member's failure is the gang's
    assert "rank 1 (worker-1 at w-1.g) exited with 137 (SIGKILL); rule restart-gang: signals" in state.log[-2]


def test_a_fatal_exit_by_default_fails_the_gang_when_the_settle_time_passes():
    state = gang_state()
    exit_report(state, 2, 3)
    exit_report(state, 0, 0)  # rank 0 "succeeding" meanwhile does not hide the failure
    state.tick(1002.9)
    assert state.outcome is None
    state.tick(1003.0)
    assert (state.outcome.phase, state.outcome.code, state.outcome.rank) == ("Failed", 3, 2)
    assert state.outcome.reason == "rank 2 (worker-2 at w-2.g) exited with 3; rule fail-gang: 1-127 (default) makes it fatal"
    assert state.restarts == 0


def test_the_rules_reach_the_launcher_and_bad_ones_are_named(tmp_path):
    env = {"TRAINHOOK_ON_FAILURE": "restart-gang", "TRAINHOOK_FAILURE_RULES": "fail-gang: 3"}
    gang = gang_state().gang
    assert read_settings(env, gang).policy.rules.decide(3).words() == \
        "rule fail-gang: 3 (trainhook.dev/failure-rules)"
    with pytest.raises(ConfigError, match=r"TRAINHOOK_FAILURE_RULES='fail-gang: nine': 'nine' is not an exit code"):
        read_settings({**env, "TRAINHOOK_FAILURE_RULES": "fail-gang: nine"}, gang)


# --- what torchrun's exit 1 hides: real torchrun runs ----------------------------------------------------------

def torchrun(tmp_path: Path, mode: str, env: dict | None = None, stop: bool = False) -> tuple:
    """Run a real torchrun with WORKER; (exit code, its output, the text of the error file it left or None)."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER if mode != "sleep" else "import time; time.sleep(60)\n")
    error_file = tmp_path / "error.json"
    child_env = {"PATH": "/usr/bin:/bin", "TORCHELASTIC_ERROR_FILE": str(error_file), **(env or {})}
    proc = subprocess.Popen([*TORCHRUN, str(script), mode, str(tmp_path / "runs")], env=child_env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if stop:
        try:
            proc.wait(timeout=8)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=90)
    return proc.returncode, output, error_file.read_text() if error_file.exists() else None


def test_torchrun_exits_1_for_a_sigkilled_worker_and_judge_finds_137(tmp_path):
    code, output, error_file = torchrun(tmp_path, "kill")
    assert code == 1  # what the launcher sees of torchrun: the signal is gone
    cause = failure_cause.judge(code, "\n".join(output.splitlines()[-40:]), error_file)  # the tail the launcher keeps
    assert cause == failure_cause.Cause(137, "", "torchrun: local rank 1's worker was killed by SIGKILL")


def test_torchrun_exits_1_for_a_workers_exit_3_and_judge_finds_3(tmp_path):
    code, output, error_file = torchrun(tmp_path, "exit3")
    assert (code, failure_cause.judge(code, output, error_file).code) == (1, 3)


def test_torchrun_stopped_by_sigterm_exits_1_and_its_error_file_says_143(tmp_path):
    code, _, error_file = torchrun(tmp_path, "sleep", stop=True)
    assert code == 1 and error_file is not None and "SignalException" in error_file
    assert failure_cause.judge(code, "", error_file) == failure_cause.Cause(143, "", "torchrun was stopped by SIGTERM")


@pytest.mark.parametrize("output, symptom", [
    ("[rank0]: RuntimeError: [pair.cc:537] Read error [10.0.0.2]:402: Connection reset by peer. GLHF", "lost-peer"),
    ("torch.distributed.DistNetworkError: failed to recv, got 0 bytes", "lost-peer"),
    ("torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. 1/2 clients joined.",
     "timeout"),
    # The program's own exception, with a lost peer beside it: its peers lost it, not it them.
    ("ValueError: bad shape\nRuntimeError: Connection closed by peer [10.0.0.3]:5", ""),
    ("Warning: connection reset by peer, retrying\nAll good", ""),  # no exception: nothing to judge
])
def test_a_lost_peer_or_a_timeout_is_read_from_the_failing_exception_only(output, symptom):
    assert failure_cause.judge(1, output).symptom == symptom


def test_an_error_file_message_names_the_symptom_and_an_old_error_file_is_not_read(tmp_path):
    text = '{"message": {"message": "RendezvousClosedError: the rendezvous was closed", "extraInfo": {}}}'
    assert failure_cause.judge(1, "", text).symptom == "lost-peer"
    assert failure_cause.error_file_message("[" * 5000) == ""  # the training wrote it: never a RecursionError
    stale = tmp_path / "old.json"
    stale.write_text(text)
    assert failure_cause.read_error_file(str(stale), stale.stat().st_mtime + 10) is None
    env, path = failure_cause.error_file_env({"TORCHELASTIC_ERROR_FILE": "/mine.json"}, str(tmp_path), 2)
    assert path == "/mine.json" and env["TORCHELASTIC_ERROR_FILE"] == "/mine.json"  # the user's is kept and read
    env, path = failure_cause.error_file_env({}, str(tmp_path), 2)
    assert env["TORCHELASTIC_ERROR_FILE"] == path == str(tmp_path / "error-2.json")


# --- admission ---------------------------------------------------------------------------------------------------

def refusal(webhook, annotations: dict) -> str:
    response = webhook.post(review(statefulset("rules", 2, annotations=annotations))).json()["response"]
    assert response["allowed"] is False
    return response["status"]["message"]


def test_a_malformed_rule_list_is_refused_at_admission_naming_key_value_and_fix(webhook):
    message = refusal(webhook, {"trainhook.dev/on-failure": "restart-gang", "trainhook.dev/failure-rules": "retry: 137"})
    assert ("trainhook.dev/failure-rules='retry: 137': not a list of failure rules ('retry: 137' does not start "
            "with restart-gang: or fail-gang:); write ordered rules `ACTION: MATCHER, ...; ...`") in message
    assert "e.g. 'fail-gang: 3, 42; restart-gang: 1'" in message
    message = refusal(webhook, {"trainhook.dev/failure-rules": "restart-gang: 1"})
    assert ("trainhook.dev/failure-rules='restart-gang: 1': the rules choose what restart-gang retries, and this "
            "gang's trainhook.dev/on-failure is 'fail-gang' (it retries nothing); set trainhook.dev/on-failure: "
            "restart-gang, or drop trainhook.dev/failure-rules") in message
    reply = webhook.post(review(statefulset("rules", 2, annotations={"trainhook.dev/on-failure": "restart-gang",
                                                                     "trainhook.dev/failure-rules": "fail-gang: 3"})))
    assert reply.json()["response"]["allowed"] is True


# --- a real gang: the launcher, torchrun and the notary --------------------------------------------------------

def run_gang(tmp_path: Path, mode: str, annotations: dict) -> tuple:
    """A one-member Job gang (annotations through the real webhook) whose training is a real torchrun of WORKER:
    (the launcher's result, the notary's record of the Job)."""
    job = indexed_job("rules", "ns", command=["python"])
    job["metadata"]["annotations"] = annotations
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    with GangNotary(tmp_path / "run") as notary:
        [pod] = notary.admit(job)
        env = {**notary.env(pod), "TRAINHOOK_COORDINATOR_PORT": str(free_port()), "PATH": "/usr/bin:/bin"}
        command = [sys.executable, "-m", "trainhook.launcher.cli", "run", "--", *TORCHRUN, str(script), mode,
                   str(tmp_path / "runs")]
        result = subprocess.run(command, capture_output=True, text=True, timeout=180, env=env)
        return result, notary.workload("ns", "Job", "rules")["metadata"]["annotations"]


def test_a_sigkilled_torchrun_worker_is_retried_by_default_and_the_gang_succeeds(tmp_path):
    result, recorded = run_gang(tmp_path, "kill", {"trainhook.dev/on-failure": "restart-gang"})
    assert result.returncode == 0, result.stderr[-4000:]
    assert ("rank 0 (worker-0 at rules-0.rules) exited with 137 (SIGKILL) (torchrun: local rank 1's worker was killed "
            "by SIGKILL); rule restart-gang: signals (default) retries it: restarting the gang (restart 1 of 3)"
            ) in result.stderr
    assert "the training exited with 1: torchrun: local rank 1's worker was killed by SIGKILL; reporting exit 137" \
        in result.stderr
    assert sorted((tmp_path / "runs").read_text().split()) == ["10", "11", "20", "21"]  # two attempts, both ranks
    assert (recorded["trainhook.dev/phase"], recorded["trainhook.dev/attempts"]) == ("Succeeded", "2")


def test_an_exit_code_named_fatal_fails_the_gang_at_once_and_the_outcome_names_the_rule(tmp_path):
    result, recorded = run_gang(tmp_path, "exit3", {"trainhook.dev/on-failure": "restart-gang",
                                                    "trainhook.dev/failure-rules": "fail-gang: 3; restart-gang: 1-127"})
    assert result.returncode == 3, result.stderr[-4000:]  # the Job's pod exits with the gang's code
    reason = ("rank 0 (worker-0 at rules-0.rules) exited with 3 (torchrun: local rank 1's worker exited with 3); "
              "rule fail-gang: 3 (trainhook.dev/failure-rules) makes it fatal")
    assert recorded["trainhook.dev/phase-reason"] == reason and recorded["trainhook.dev/exit-code"] == "3"
    assert "restarting the gang" not in result.stderr
    assert sorted((tmp_path / "runs").read_text().split()) == ["10", "11"]  # one attempt only
