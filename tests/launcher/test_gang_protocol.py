"""The gang's coordination, in process: the signed wire format, the coordinator's decisions (pure), the lifecycle
settings, and a real coordinator with real member links on loopback."""

from __future__ import annotations

import json
import queue
import socket
import subprocess
import sys
import time

import pytest
from gang_notary import GangNotary, indexed_job
from webhook_process import free_port

from trainhook.launcher import wire
from trainhook.launcher.coordination.coordinator import Coordinator
from trainhook.launcher.coordination.coordinator_rules import CoordinatorState
from trainhook.launcher.coordination.link import Link
from trainhook.launcher.coordination.report import DONE, EXITED, RUNNING, STOPPED, Report
from trainhook.launcher.outcome import EXIT_CODE, PHASE, PHASE_REASON, SUCCEEDED, Outcome
from trainhook.launcher.pod_view import ConfigError, GangView, Peer, parse_gang
from trainhook.launcher.policy import FAIL_GANG, RESTART_GANG, GangPolicy, attempt_env, read_settings

TOKEN = b"a" * 64


def gang(size: int = 3, rank: int = 0, address: str = "127.0.0.1") -> GangView:
    peers = tuple(Peer("worker", i, i, address if i == 0 else f"w-{i}.g") for i in range(size))
    return GangView(framework="pytorch", job_name="g", namespace="ns", role="worker", index=rank, rank=rank,
                peers=peers, subdomain="g", address=peers[rank].address, port=23456, gang_wait="dns",
                gang_wait_port=29499, wait_timeout=600.0)


# --- the wire -------------------------------------------------------------------------------------------------

def channels(coordinator_token: bytes = TOKEN, member_token: bytes = TOKEN):
    a, b = socket.socketpair()
    cn, mn = wire.new_nonce(), wire.new_nonce()
    coordinator = wire.Channel(a, wire.LineReader(a), coordinator_token, "coordinator", cn, mn)
    member = wire.Channel(b, wire.LineReader(b), member_token, "member", cn, mn)
    return coordinator, member


def test_signed_messages_pass_both_ways():
    coordinator, member = channels()
    member.send({"type": "state", "report": {"code": 3}})
    coordinator.send({"type": "stop", "attempt": 1})
    assert coordinator.receive() == {"type": "state", "report": {"code": 3}}
    assert member.receive() == {"type": "stop", "attempt": 1}


def test_a_message_signed_with_another_gangs_token_is_refused():
    coordinator, member = channels(member_token=b"b" * 64)
    member.send({"type": "state", "report": {"status": "exited", "code": 0}})
    with pytest.raises(wire.RejectedMessage, match="bad signature"):
        coordinator.receive()


def test_a_replayed_or_reordered_message_is_refused():
    coordinator, member = channels()
    member.send({"type": "state", "n": 1})
    line = coordinator.reader.sock.recv(65536)
    coordinator.reader.buffer = line + line  # the same signed line twice
    assert coordinator.receive() == {"type": "state", "n": 1}
    with pytest.raises(wire.RejectedMessage, match="out of order"):
        coordinator.receive()


def test_a_tampered_message_is_refused():
    coordinator, member = channels()
    member.send({"type": "state", "report": {"code": 3}})
    message = json.loads(coordinator.reader.sock.recv(65536))
    message["body"]["report"]["code"] = 0
    coordinator.reader.buffer = json.dumps(message).encode() + b"\n"
    with pytest.raises(wire.RejectedMessage, match="bad signature"):
        coordinator.receive()


def test_a_message_reflected_back_to_its_sender_is_refused():
    coordinator, member = channels()
    member.send({"type": "state"})
    line = coordinator.reader.sock.recv(65536)
    member.reader.buffer = line  # the member's own signed message, sent back to it as if from the coordinator
    with pytest.raises(wire.RejectedMessage, match="bad signature"):
        member.receive()


@pytest.mark.parametrize("greeting, message", [
    (None, "closed before greeting"),
    ({"protocol": "trainhook-gang/1"}, "not a trainhook gang launcher"),
    (wire.member_greeting("other", "g", 1, "n" * 32), "a launcher of gang other/g, not ns/g"),
    (wire.member_greeting("ns", "g", 3, "n" * 32), "rank 3 is not in this gang of 3"),
    (wire.member_greeting("ns", "g", 1, ""), "no nonce"),
])
def test_greetings_from_outside_the_gang_are_refused_with_the_reason(greeting, message):
    with pytest.raises(wire.RejectedMessage, match=message):
        wire.check_member_greeting(greeting, "ns", "g", 3)


# --- the coordinator's decisions ---------------------------------------------------------------------------------

def state(size: int = 3, **policy) -> CoordinatorState:
    return CoordinatorState(gang(size), GangPolicy(**policy), now=1000.0)


def drain(s: CoordinatorState) -> list[tuple[int, str]]:
    out = [(rank, body["type"]) for rank, body in s.outbox]
    s.outbox.clear()
    return out


def assemble(s: CoordinatorState) -> None:
    for rank in range(len(s.records)):
        s.joined(rank, rank + 1, Report())
    drain(s)
    s.log.clear()


def report(s: CoordinatorState, rank: int, status: str, code: int | None = None) -> None:
    s.reported(rank, rank + 1, Report(attempt=s.attempt, status=status, code=code, restarts=s.restarts,
                                      since=s.since))


def test_the_first_attempt_starts_only_when_every_member_has_joined():
    s = state()
    s.joined(0, 1, Report())
    s.joined(2, 3, Report())
    assert drain(s) == [(0, "welcome"), (2, "welcome")] and s.attempt == 0
    s.joined(1, 2, Report())
    assert drain(s) == [(1, "welcome"), (0, "start"), (1, "start"), (2, "start")]
    assert s.attempt == 1 and s.since == 1000.0


def test_rank_0_exiting_0_ends_the_gang_after_workers_that_finished_their_part():
    s = state()
    assemble(s)
    report(s, 2, EXITED, 0)
    assert s.outcome is None and "finished its part of attempt 1" in s.log[-1]
    report(s, 0, EXITED, 0)
    assert s.outcome is not None and s.outcome.phase == SUCCEEDED and s.outcome.rank == 0
    assert sorted(drain(s)) == [(0, "done"), (1, "done"), (2, "done")]
    assert not s.delivered()
    for rank in range(3):
        s.reported(rank, rank + 1, Report(attempt=1, status=DONE, outcome=s.outcome.to_dict()))
    assert s.delivered()


def tensorflow_gang(shape: list[tuple[str, int]]) -> GangView:
    peers, rank = [], 0
    for role, count in shape:
        for index in range(count):
            peers.append(Peer(role, index, rank, f"tf-{role}-{index}.tf"))
            rank += 1
    return GangView(framework="tensorflow", job_name="tf", namespace="ns", role=shape[0][0], index=0, rank=0,
                peers=tuple(peers), subdomain="tf", address=peers[0].address, port=2222, gang_wait="dns",
                gang_wait_port=29499, wait_timeout=600.0)


def test_without_a_chief_tensorflows_worker_0_decides_success_and_a_parameter_server_never_does():
    """Kubeflow's TFJob rule: rank 0 here is the parameter server, which serves until it is stopped."""
    s = CoordinatorState(tensorflow_gang([("ps", 1), ("worker", 2)]), GangPolicy(), now=1000.0)
    assemble(s)
    report(s, 0, EXITED, 0)  # a parameter server that ends on its own decides nothing
    assert s.outcome is None and "waiting for rank 1 (worker-0 at tf-worker-0.tf)" in s.log[-1]
    report(s, 2, EXITED, 0)
    assert s.outcome is None
    report(s, 1, EXITED, 0)
    assert s.outcome is not None and s.outcome.phase == SUCCEEDED and s.outcome.rank == 1
    assert s.outcome.reason == "rank 1 (worker-0 at tf-worker-0.tf) exited 0"


def test_a_tensorflow_chief_decides_success_when_there_is_one():
    s = CoordinatorState(tensorflow_gang([("chief", 1), ("ps", 1), ("worker", 1)]), GangPolicy(), now=1000.0)
    assemble(s)
    report(s, 2, EXITED, 0)
    assert s.outcome is None
    report(s, 0, EXITED, 0)
    assert s.outcome is not None and s.outcome.rank == 0


def test_a_failure_ends_the_gang_with_the_members_code_under_fail_gang():
    s = state(on_failure=FAIL_GANG)
    assemble(s)
    report(s, 1, EXITED, 137)
    assert (s.outcome.phase, s.outcome.code, s.outcome.rank) == ("Failed", 137, 1)
    assert s.outcome.reason == "rank 1 (worker-1 at w-1.g) exited with 137 (SIGKILL)"  # fail-gang: no rule asked
    assert sorted(drain(s)) == [(0, "done"), (1, "done"), (2, "done")]


def test_restart_gang_stops_everyone_then_starts_the_next_attempt_together():
    s = state(on_failure=RESTART_GANG, max_restarts=1)
    assemble(s)
    report(s, 1, EXITED, 137)
    assert s.outcome is None and s.restarts == 1
    assert sorted(drain(s)) == [(0, "stop"), (2, "stop")]
    report(s, 0, STOPPED, 143)
    assert drain(s) == []  # rank 2 still runs
    report(s, 2, STOPPED, 143)
    assert drain(s) == [(0, "start"), (1, "start"), (2, "start")] and s.attempt == 2
    report(s, 2, EXITED, 139)
    assert (s.outcome.code, s.outcome.attempt, s.outcome.restarts) == (139, 2, 1)
    assert s.outcome.reason == ("rank 2 (worker-2 at w-2.g) exited with 139 (SIGSEGV); rule restart-gang: signals "
                                "(default) retries it, but restart-gang's budget (1) is spent")


def test_restart_gang_never_retries_codes_below_128_by_default():
    s = state(on_failure=RESTART_GANG, max_restarts=5, settle=0.0)
    assemble(s)
    report(s, 2, EXITED, 1)
    assert s.outcome.code == 1 and s.restarts == 0
    assert s.outcome.reason.endswith("exited with 1; rule fail-gang: 1-127 (default) makes it fatal")


def test_a_member_whose_launcher_goes_away_mid_run_is_a_retryable_failure():
    s = state(on_failure=RESTART_GANG)
    assemble(s)
    s.lost(1, 2)
    assert s.restarts == 1 and s.phase == "restarting"
    assert "rank 1 (worker-1 at w-1.g): its launcher went away" in s.log[0]
    report(s, 0, STOPPED, 143)
    report(s, 2, STOPPED, 143)
    assert s.attempt == 1  # waiting for rank 1 to come back
    s.joined(1, 7, Report())  # its restarted container knows nothing
    assert s.attempt == 2


def test_a_member_that_finished_its_part_is_told_so_when_its_container_restarts():
    s = state()
    assemble(s)
    report(s, 1, EXITED, 0)
    s.lost(1, 2)
    assert s.outcome is None and s.restarts == 0  # a finished member going away is no failure
    s.joined(1, 9, Report())
    welcome = [body for rank, body in s.outbox if body["type"] == "welcome"]
    assert welcome == [{"type": "welcome", "attempt": 1, "phase": "running", "restarts": 0, "since": 1000.0,
                        "finished": True}]
    assert not [body for _, body in s.outbox if body["type"] == "start"]


def test_a_member_joining_after_the_outcome_is_told_it_and_never_started():
    s = state()
    assemble(s)
    report(s, 0, EXITED, 0)
    drain(s)
    s.lost(2, 3)
    s.joined(2, 10, Report())
    assert drain(s) == [(2, "done")]


def test_a_coordinator_never_adopts_an_outcome_a_member_claims():
    """Issue 22: a member (or whoever holds its pod) saying "the gang is already done" does not end the gang;
    only the coordinator's own observation or the notary's record does (gang_run asks the notary first)."""
    s = state()
    claimed = Outcome(SUCCEEDED, 0, "rank 0 exited 0", 0, "2025-01-01T00:00:00Z", 1, 0)
    s.joined(1, 2, Report(attempt=1, status=DONE, outcome=claimed.to_dict()))
    s.reported(1, 2, Report(attempt=1, status=DONE, outcome=claimed.to_dict()))
    assert s.outcome is None and (1, "done") not in drain(s)
    assert sum("reports that the gang is done (Succeeded): not adopted" in line for line in s.log) == 1
    s.joined(0, 1, Report())
    s.joined(2, 3, Report())
    assert s.phase == "running" and s.attempt == 1  # the gang runs its own course
    report(s, 0, EXITED, 0)
    assert s.outcome.reason == "rank 0 (worker-0 at 127.0.0.1) exited 0"
    # What the notary recorded is adopted (gang_run's GET /v1/outcome, before the coordinator serves).
    t = state()
    t.adopt(claimed, "the notary's record")
    assert t.outcome == claimed


def test_a_gang_restart_is_handed_to_the_notary_as_an_event():
    s = state(on_failure=RESTART_GANG)
    assemble(s)
    report(s, 1, EXITED, 137)
    assert [(kind, reason) for kind, reason, _ in s.events] == [("Warning", "GangRestarted")]
    assert "exited with 137" in s.events[0][2] and "restart 1 of 3" in s.events[0][2]


def test_a_restarted_coordinator_treats_a_running_attempt_as_rank_0_lost():
    s = state(on_failure=RESTART_GANG)
    s.joined(0, 1, Report())
    s.joined(1, 2, Report(attempt=3, status=STOPPED, code=143, restarts=2, since=900.0))
    assert s.attempt == 3 and s.restarts == 3 and s.since == 900.0 and s.phase == "restarting"
    assert "its launcher restarted during attempt 3" in " ".join(s.log)
    s.joined(2, 3, Report(attempt=3, status=RUNNING, restarts=2, since=900.0))
    assert (2, "stop") in drain(s)
    report(s, 2, STOPPED, 143)
    assert s.attempt == 4 and s.phase == "running"


def test_the_active_deadline_fails_the_gang_with_124():
    s = state(deadline=30.0)
    assemble(s)
    s.tick(1029.0)
    assert s.outcome is None
    s.tick(1031.0)
    assert s.outcome.code == 124 and s.outcome.reason.startswith("DeadlineExceeded")


def test_members_that_never_join_fail_the_gang_by_name():
    s = state(join_timeout=60.0)
    s.joined(0, 1, Report())
    s.tick(1061.0)
    assert s.outcome.code == 1
    assert s.outcome.reason.startswith("2 member(s) did not join within 60s: rank 1 (worker-1 at w-1.g), rank 2")
    assert "trainhook-launch run" in s.outcome.reason


# --- settings and each attempt's environment ------------------------------------------------------------------

def env(**more: str) -> dict[str, str]:
    base = {"TRAINHOOK_FRAMEWORK": "pytorch", "TRAINHOOK_JOB_NAME": "g", "TRAINHOOK_NAMESPACE": "ns",
            "TRAINHOOK_ROLE": "worker", "TRAINHOOK_INDEX": "1", "TRAINHOOK_REPLICAS": "worker=2",
            "TRAINHOOK_HOSTS": "worker=g", "TRAINHOOK_SUBDOMAIN": "g"}
    return {**base, **more}


def test_settings_default_to_fail_gang_and_a_parking_statefulset():
    settings = read_settings(env(), parse_gang(env()))
    policy = settings.policy  # GangPolicy(FAIL_GANG, 3, None, 600.0): its fields (a plain class, compared by identity)
    assert (policy.on_failure, policy.max_restarts, policy.deadline, policy.join_timeout, policy.rules.rules,
            policy.settle) == (FAIL_GANG, 3, None, 600.0, (), GangPolicy().settle)
    assert (settings.workload_kind, settings.workload_name, settings.restart_policy, settings.parks) == (
        "StatefulSet", "g", "Always", True)
    assert settings.port == 29497 and settings.key == b""  # the key never comes from the environment
    assert (settings.notary_url, settings.identity_token) == ("", "/var/run/secrets/trainhook.dev/identity/token")


def test_an_indexed_jobs_pods_exit_instead_of_parking():
    e = env(JOB_COMPLETION_INDEX="1")
    settings = read_settings(e, parse_gang(e))
    assert (settings.workload_kind, settings.restart_policy, settings.parks) == ("Job", "Never", False)
    e = env(TRAINHOOK_WORKLOAD="Job/train", TRAINHOOK_RESTART_POLICY="OnFailure")
    settings = read_settings(e, parse_gang(e))
    assert (settings.workload_kind, settings.workload_name, settings.parks) == ("Job", "train", False)


def test_bad_lifecycle_variables_are_all_named():
    e = env(TRAINHOOK_ON_FAILURE="retry", TRAINHOOK_MAX_RESTARTS="x", TRAINHOOK_RESTART_POLICY="Sometimes")
    with pytest.raises(ConfigError) as error:
        read_settings(e, parse_gang(e))
    text = str(error.value)
    assert "TRAINHOOK_ON_FAILURE='retry'" in text and "TRAINHOOK_MAX_RESTARTS='x'" in text
    assert "TRAINHOOK_RESTART_POLICY='Sometimes'" in text


def test_each_attempt_gets_a_fresh_rendezvous():
    base = {"MASTER_PORT": "23456", "PET_MASTER_PORT": "23456", "PET_RDZV_ID": "g", "OTHER": "x"}
    first = attempt_env(base, 1)
    assert first == {**base, "TRAINHOOK_ATTEMPT": "1", "TRAINHOOK_RESTARTS": "0"}  # Kubeflow's values unchanged
    third = attempt_env(base, 3)
    assert (third["MASTER_PORT"], third["PET_MASTER_PORT"], third["PET_RDZV_ID"]) == ("23458", "23458",
                                                                                      "g-attempt-3")
    assert attempt_env(third, 4)["PET_RDZV_ID"] == "g-attempt-4"


def test_the_outcome_is_recorded_as_annotations_and_read_back():
    outcome = Outcome("Failed", 3, "rank 2 exited with 3", 2, "2025-01-01T00:00:00Z")
    annotations = outcome.annotations()
    assert annotations[PHASE] == "Failed" and annotations[EXIT_CODE] == "3"
    assert annotations[PHASE_REASON] == "rank 2 exited with 3"
    back = Outcome.from_annotations(annotations)
    assert (back.phase, back.code, back.reason) == ("Failed", 3, "rank 2 exited with 3")
    assert Outcome.from_annotations({}) is None


# --- a real coordinator and real member links, on loopback --------------------------------------------------------


def next_directive(events: queue.SimpleQueue, kind: str, timeout: float = 10) -> dict:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            event = events.get(timeout=0.1)
        except queue.Empty:
            continue
        if event[0] == "directive" and event[1]["type"] == kind:
            return event[1]
    raise AssertionError(f"no {kind} within {timeout}s")


def started_tcp_gang(log, before=None) -> tuple[Coordinator, object, list]:
    """A real coordinator on a free port and both members' Links of a 2-pod gang, its first attempt started;
    (the coordinator, the members' settings, [(link, events)]). `before(port)` runs once the coordinator listens,
    before the members connect. The caller closes them."""
    port = free_port()
    coordinator = Coordinator(gang(2), GangPolicy(), TOKEN, port, log=log)
    coordinator.start()
    if before is not None:
        before(port)
    settings = read_settings(env(TRAINHOOK_COORDINATOR_PORT=str(port)), parse_gang(env()))
    settings = settings.replace(key=TOKEN)
    links = []
    for rank in (0, 1):
        events: queue.SimpleQueue = queue.SimpleQueue()
        link = Link(gang(2, rank), settings, events, Report())
        link.start()
        links.append((link, events))
    for _, events in links:
        assert next_directive(events, "start")["attempt"] == 1
    return coordinator, settings, links


def test_a_coordinator_and_its_members_over_tcp_refusing_an_outsider():
    lines: list[str] = []
    coordinator, settings, links = started_tcp_gang(lines.append)
    try:
        # An outsider with another token claims that rank 0 finished: refused, nothing changes.
        outsider = settings.replace(key=b"x" * 64)
        events = queue.SimpleQueue()
        intruder = Link(gang(2, 0), outsider, events, Report(attempt=1, status=EXITED, code=0))
        intruder.start()
        time.sleep(1.0)
        intruder.close()
        assert any("refused a connection from 127.0.0.1: bad signature" in line for line in lines), lines
        assert coordinator.state.outcome is None
        # The real rank 1 fails: both members hear the outcome.
        links[1][0].update(Report(attempt=1, status=EXITED, code=3))
        for _, events in links:
            assert next_directive(events, "done")["outcome"]["code"] == 3
        for rank, (link, _) in enumerate(links):
            link.update(Report(attempt=1, status=DONE, outcome=coordinator.state.outcome.to_dict()))
        assert coordinator.wait_delivered(5)
    finally:
        for link, _ in links:
            link.close()
        coordinator.close()


def test_a_member_whose_launcher_restarts_after_the_outcome_is_told_it_on_rejoining():
    coordinator, settings, links = started_tcp_gang(lambda line: None)
    try:
        links[1][0].update(Report(attempt=1, status=EXITED, code=3))
        assert next_directive(links[1][1], "done")["outcome"]["code"] == 3
        links[1][0].close()  # rank 1's launcher goes (its container restarts) after the gang is done
        events = queue.SimpleQueue()
        again = Link(gang(2, 1), settings, events, Report())
        again.start()
        links.append((again, events))
        started = time.monotonic()
        assert next_directive(events, "done")["outcome"]["code"] == 3  # the outcome, at once, not a retry loop
        assert time.monotonic() - started < 5
    finally:
        for link, _ in links:
            link.close()
        coordinator.close()


def test_run_in_a_gang_without_a_notary_runs_the_command_alone():
    command = [sys.executable, "-m", "trainhook.launcher.cli", "run", "--", sys.executable, "-c",
               "raise SystemExit(7)"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=30,
                            env={**env(), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 7
    assert "TRAINHOOK_NOTARY is not set" in result.stderr


def test_a_bad_lifecycle_variable_is_a_usage_error():
    command = [sys.executable, "-m", "trainhook.launcher.cli", "run", "--", "true"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=30,
                            env={**env(TRAINHOOK_ON_FAILURE="sometimes"), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 2
    assert "TRAINHOOK_ON_FAILURE='sometimes': use fail-gang or restart-gang" in result.stderr


def test_a_run_nested_in_a_gang_aware_launchers_training_runs_its_command_alone():
    command = [sys.executable, "-m", "trainhook.launcher.cli", "run", "--", sys.executable, "-c",
               "raise SystemExit(5)"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=30,
                            env={**env(TRAINHOOK_ATTEMPT="1"), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 5 and result.stderr == ""


def solo_env(notary: GangNotary, pod: dict, tmp_path) -> dict[str, str]:
    """A one-member Job gang's pod, as the webhook mutated it: rank 0 alone, its coordinator on a free loopback
    port, its state directory (the emptyDir that outlives a container restart) under tmp_path."""
    return {**notary.env(pod), "TRAINHOOK_COORDINATOR_PORT": str(free_port()),
            "TRAINHOOK_STATE_DIR": str(tmp_path / "state"), "PATH": "/usr/bin:/bin"}


def test_the_outcome_marker_keeps_a_restarted_container_from_training_again(tmp_path):
    flag = tmp_path / "trained"
    command = [sys.executable, "-m", "trainhook.launcher.cli", "run", "--", sys.executable, "-c",
               f"open({str(flag)!r}, 'a').write('x')"]
    with GangNotary(tmp_path / "run") as notary:
        [pod] = notary.admit(indexed_job("g", "ns"))
        first = subprocess.run(command, capture_output=True, text=True, timeout=60,
                               env=solo_env(notary, pod, tmp_path))
        assert first.returncode == 0, first.stderr
        assert flag.read_text() == "x"
        assert "the notary recorded the outcome: Succeeded" in first.stderr
        assert notary.workload("ns", "Job", "g")["metadata"]["annotations"][PHASE] == SUCCEEDED
        marker = json.loads((tmp_path / "state" / "outcome.json").read_text())
        assert (marker["namespace"], marker["job"], marker["outcome"]["phase"]) == ("ns", "g", "Succeeded")
        # The kubelet restarts the container (OnFailure, or Always): the emptyDir still holds the marker.
        again = subprocess.run(command, capture_output=True, text=True, timeout=60,
                               env=solo_env(notary, pod, tmp_path))
        assert again.returncode == 0, again.stderr
        assert "outcome.json records that the gang is done (Succeeded)" in again.stderr
        assert "not running the training: gang succeeded" in again.stderr
        assert flag.read_text() == "x"  # not run again
        failed = Outcome("Failed", 3, "rank 1 (worker-1 at g-1.g) exited with 3", 1, "2025-01-01T00:00:00Z")
        (tmp_path / "state" / "outcome.json").write_text(json.dumps({"namespace": "ns", "job": "g",
                                                                     "outcome": failed.to_dict()}))
        third = subprocess.run(command, capture_output=True, text=True, timeout=60,
                               env=solo_env(notary, pod, tmp_path))
        assert third.returncode == 3, third.stderr  # a Job's pod exits with the gang's code, again, without training
        assert flag.read_text() == "x"
        # The record is written once: the first outcome stays on the Job, and one Event says it.
        assert notary.workload("ns", "Job", "g")["metadata"]["annotations"][PHASE] == SUCCEEDED
        assert [e["reason"] for e in notary.events()] == ["GangSucceeded"]
