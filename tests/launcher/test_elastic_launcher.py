"""An elastic PyTorch gang in the launcher (issue 18): its gang read from the environment, the gang wait's view, the
coordinator's rules for a gang whose size changes (pure), each attempt's environment, and a real coordinator with
real member links on loopback where one member leaves and another joins the running attempt."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import time

import pytest
from webhook_process import free_port

from trainhook.gang import keys
from trainhook.launcher.coordination.coordinator import Coordinator
from trainhook.launcher.coordination.coordinator_rules import CoordinatorState
from trainhook.launcher.coordination.link import Link
from trainhook.launcher.coordination.report import EXITED, RUNNING, STOPPED, Report
from trainhook.launcher.outcome import EXIT_NOT_ASSEMBLED
from trainhook.launcher.pod_view import ConfigError, GangView, Peer, parse_gang
from trainhook.launcher.policy import RESTART_GANG, TORCH_DISABLE_SHARED_STORE, GangPolicy, attempt_env, read_settings
from trainhook.launcher.wait.command import elastic_wait_view

GANG_KEY = b"e" * 64


def env(index: int = 1, **overrides: str | None) -> dict[str, str]:
    """Worker `index` of a 2:4 elastic StatefulSet `el` created with 2 replicas, as its pods see it."""
    values = {
        keys.TH_FRAMEWORK: "pytorch", keys.TH_JOB_NAME: "el", keys.TH_NAMESPACE: "ns", keys.TH_ROLE: "worker",
        keys.TH_INDEX: str(index), keys.TH_RANK: str(index), keys.TH_REPLICAS: "worker=2",
        keys.TH_HOSTS: "worker=el", keys.TH_SUBDOMAIN: "el", keys.TH_ELASTIC: "2:4",
    }
    for name, value in overrides.items():
        if value is None:
            values.pop(name, None)
        else:
            values[name] = value
    return values


# --- the gang -------------------------------------------------------------------------------------------------

def test_an_elastic_gang_has_every_member_it_may_grow_to_and_starts_at_min():
    gang = parse_gang(env(index=3))
    assert gang.elastic == (2, 4) and gang.size == 4 and gang.assembled_at == 2
    assert [p.address for p in gang.peers] == [f"el-{i}.el" for i in range(4)]
    assert gang.me == Peer("worker", 3, 3, "el-3.el")


def test_the_training_containers_pet_nnodes_says_elastic_without_trainhook_elastic():
    gang = parse_gang(env(**{keys.TH_ELASTIC: None, keys.PET_NNODES: "1:3", keys.PET_RDZV_BACKEND: "c10d"}))
    assert gang.elastic == (1, 3) and gang.size == 3
    fixed = parse_gang(env(**{keys.TH_ELASTIC: None, keys.PET_NNODES: "2"}))
    assert fixed.elastic is None and fixed.size == 2 and fixed.assembled_at == 2


def test_a_pod_beyond_the_maximum_is_told_so_with_the_fix():
    with pytest.raises(ConfigError) as e:
        parse_gang(env(index=4, **{keys.TH_RANK: "4"}))
    assert str(e.value) == ("TRAINHOOK_INDEX='4': this pod is beyond the elastic gang's maximum of 4 members "
                            "(trainhook.dev/elastic=2:4); scale the workload to at most 4 worker replicas, or raise "
                            "the maximum")


def test_a_malformed_elastic_range_is_named():
    with pytest.raises(ConfigError, match=r"TRAINHOOK_ELASTIC='4:2': not an elastic range min:max"):
        parse_gang(env(**{keys.TH_ELASTIC: "4:2"}))


def test_the_gang_wait_waits_for_the_first_min_members_and_a_late_member_resolves_them():
    early = elastic_wait_view(parse_gang(env(index=1, **{keys.TH_GANG_WAIT: "tcp"})))
    assert [p.rank for p in early.peers] == [0, 1] and early.gang_wait == "tcp"
    late = elastic_wait_view(parse_gang(env(index=3, **{keys.TH_GANG_WAIT: "tcp"})))
    assert [p.rank for p in late.peers] == [0, 1, 3] and late.gang_wait == "dns"  # nobody runs the barrier now


# --- the coordinator's rules (pure) ---------------------------------------------------------------------------

def gang(rank: int = 0, size: int = 4, elastic: tuple[int, int] | None = (2, 4)) -> GangView:
    peers = tuple(Peer("worker", i, i, "127.0.0.1" if i == 0 else f"el-{i}.el") for i in range(size))
    return GangView(framework="pytorch", job_name="el", namespace="ns", role="worker", index=rank, rank=rank,
                peers=peers, subdomain="el", address=peers[rank].address, port=23456, gang_wait="dns",
                gang_wait_port=29499, wait_timeout=600.0, elastic=elastic)


def state(**policy) -> CoordinatorState:
    return CoordinatorState(gang(), GangPolicy(**policy), now=1000.0)


def drain(s: CoordinatorState) -> list[tuple[int, str]]:
    out = [(rank, body["type"]) for rank, body in s.outbox]
    s.outbox.clear()
    s.log.clear()
    return out


def report(s: CoordinatorState, rank: int, status: str, code: int | None = None) -> None:
    s.reported(rank, rank + 1, Report(attempt=s.attempt, status=status, code=code, restarts=s.restarts,
                                      since=s.since))


def running(s: CoordinatorState, members: int = 2) -> CoordinatorState:
    for rank in range(members):
        s.joined(rank, rank + 1, Report())
    drain(s)
    return s


def test_the_first_attempt_starts_with_min_members_not_max():
    s = state()
    s.joined(0, 1, Report())
    assert drain(s) == [(0, "welcome")] and s.attempt == 0
    s.joined(1, 2, Report())
    assert drain(s) == [(1, "welcome"), (0, "start"), (1, "start")] and s.attempt == 1


def test_a_member_joining_a_running_attempt_starts_at_once():
    s = running(state())
    s.joined(2, 3, Report())
    assert s.outbox[-1] == (2, {"type": "start", "attempt": 1, "restarts": 0, "since": 1000.0})
    assert "joined the running elastic gang (3 members now)" in s.log[-1]
    assert drain(s) == [(2, "welcome"), (2, "start")]


def test_a_member_leaving_is_not_a_failure_and_its_stopped_training_is_not_judged():
    s = running(state(), members=3)
    s.left(2, 3, "worker-2 got SIGTERM")
    assert "is leaving the elastic gang (worker-2 got SIGTERM); not a failure" in s.log[-1]
    report(s, 2, EXITED, 143)
    s.lost(2, 3)
    assert s.outcome is None and drain(s) == []
    report(s, 0, EXITED, 0)
    assert s.outcome is not None and s.outcome.succeeded


def test_a_launcher_gone_without_a_word_is_not_a_failure_either():
    s = running(state(), members=3)
    s.lost(2, 3)
    assert s.outcome is None and "went away without leaving" in s.log[-1]


def test_a_fixed_size_gang_still_fails_when_a_member_goes():
    s = CoordinatorState(gang(size=2, elastic=None), GangPolicy(), now=1000.0)
    running(s)
    s.left(1, 2, "SIGTERM")  # only an elastic gang's member may leave
    s.lost(1, 2)
    assert s.outcome is not None and s.outcome.code == 129


def test_a_real_failure_still_fails_the_gang():
    s = running(state(), members=3)
    report(s, 1, EXITED, 3)
    assert s.outcome is not None and (s.outcome.code, s.outcome.rank) == (3, 1)


def test_restart_gang_restarts_with_the_members_that_are_here():
    s = running(state(on_failure=RESTART_GANG), members=3)
    s.left(2, 3, "scaled down")
    report(s, 1, EXITED, 137)
    assert drain(s) == [(0, "stop")]
    report(s, 0, STOPPED, 143)
    assert s.attempt == 2 and drain(s) == [(0, "start"), (1, "start")]


def test_fewer_than_min_members_for_the_wait_timeout_fails_the_gang_saying_so():
    s = running(state(join_timeout=30.0), members=2)
    s.left(1, 2, "deleted")
    s.tick(1010.0)
    assert "fewer than its minimum of 2" in s.log[-1] and s.outcome is None
    s.tick(1041.0)
    assert s.outcome is not None and s.outcome.code == EXIT_NOT_ASSEMBLED
    assert s.outcome.reason.startswith("the elastic gang had only 1 of its minimum 2 members for 30s (missing: rank "
                                       "1 (worker-1 at el-1.el)); scale the workload to at least 2 replicas")


def test_a_member_back_in_time_keeps_the_gang_going():
    s = running(state(join_timeout=30.0), members=2)
    s.left(1, 2, "evicted")
    s.tick(1010.0)
    s.joined(1, 7, Report())  # the StatefulSet controller's replacement pod
    assert (1, "start") in drain(s)
    s.tick(1100.0)
    assert s.outcome is None and s.short_since is None


def test_the_outcome_waits_only_for_the_members_that_are_here():
    s = running(state(), members=3)
    s.left(2, 3, "scaled down")
    report(s, 0, EXITED, 0)
    for rank in (0, 1):
        s.reported(rank, rank + 1, Report(attempt=1, status="done", outcome=s.outcome.to_dict()))
    assert s.delivered()


# --- each attempt's environment -------------------------------------------------------------------------------

def test_an_elastic_gangs_training_does_not_share_the_rendezvous_store_unless_the_user_says_so():
    elastic = {keys.PET_NNODES: "2:4", keys.PET_RDZV_BACKEND: "c10d"}
    assert attempt_env(elastic, 1)[TORCH_DISABLE_SHARED_STORE] == "1"
    assert attempt_env({**elastic, TORCH_DISABLE_SHARED_STORE: "0"}, 1)[TORCH_DISABLE_SHARED_STORE] == "0"
    assert TORCH_DISABLE_SHARED_STORE not in attempt_env({keys.PET_NNODES: "2"}, 1)


# --- a real coordinator, real links ---------------------------------------------------------------------------


def next_directive(events: queue.SimpleQueue, kind: str, timeout: float = 10.0) -> dict:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            event = events.get(timeout=0.2)
        except queue.Empty:
            continue
        if event[0] == "directive" and event[1]["type"] == kind:
            return event[1]
    raise AssertionError(f"no {kind} within {timeout}s")


def test_over_tcp_a_member_leaves_and_another_joins_the_running_attempt():
    port = free_port()
    lines: list[str] = []
    coordinator = Coordinator(gang(), GangPolicy(), GANG_KEY, port, log=lines.append)
    coordinator.start()
    links = {}
    try:
        settings = read_settings({keys.TH_COORDINATOR_PORT: str(port)}, parse_gang(env()))
        settings = settings.replace(key=GANG_KEY)
        local = [Peer("worker", i, i, "127.0.0.1") for i in range(4)]  # every member dials loopback here

        def link(rank: int) -> queue.SimpleQueue:
            events: queue.SimpleQueue = queue.SimpleQueue()
            member = gang(rank).replace(peers=tuple(local))
            links[rank] = Link(member, settings, events, Report())
            links[rank].start()
            return events

        first = [link(0), link(1)]
        for events in first:
            assert next_directive(events, "start")["attempt"] == 1
        for rank in (0, 1):
            links[rank].update(Report(attempt=1, status=RUNNING))
        late = link(2)
        assert next_directive(late, "start")["attempt"] == 1
        links[2].update(Report(attempt=1, status=RUNNING))
        links[1].leave("worker-1 got SIGTERM")
        links[1].update(Report(attempt=1, status=EXITED, code=143))
        links[1].close()
        time.sleep(0.5)
        assert coordinator.state.outcome is None, lines
        links[0].update(Report(attempt=1, status=EXITED, code=0))
        assert next_directive(first[0], "done")["outcome"]["phase"] == "Succeeded"
        assert next_directive(late, "done")["outcome"]["phase"] == "Succeeded"
        assert any("is leaving the elastic gang (worker-1 got SIGTERM)" in line for line in lines), lines
    finally:
        for member in links.values():
            member.close()
        coordinator.close()


def test_a_pods_gang_wait_beyond_the_maximum_says_so_and_exits_2_instead_of_waiting():
    result = subprocess.run([sys.executable, "-m", "trainhook.launcher.cli", "wait"], capture_output=True, text=True,
                            timeout=60, env={**os.environ, **env(index=4, **{keys.TH_RANK: "4"})})
    assert result.returncode == 2, result.stderr
    assert "this pod is beyond the elastic gang's maximum of 4 members (trainhook.dev/elastic=2:4); scale the " \
           "workload to at most 4 worker replicas, or raise the maximum" in result.stderr
