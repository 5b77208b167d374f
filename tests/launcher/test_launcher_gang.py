"""The launcher's view of its gang: TRAINHOOK_* parsing, and how the CLI reports a bad environment."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from trainhook.gang import keys
from trainhook.launcher.pod_view import ConfigError, Peer, parse_gang

LAUNCH = [sys.executable, "-m", "trainhook.launcher.cli"]


def gang_env(**overrides: str | None) -> dict[str, str]:
    """A pytorch gang of master=1,worker=3 as the webhook injects it into worker 1 (global rank 2)."""
    env = {
        keys.TH_FRAMEWORK: "pytorch", keys.TH_JOB_NAME: "job", keys.TH_NAMESPACE: "ns",
        keys.TH_ROLE: "worker", keys.TH_INDEX: "1", keys.TH_RANK: "2",
        keys.TH_REPLICAS: "master=1,worker=3", keys.TH_HOSTS: "master=job-master,worker=job-worker",
        keys.TH_SUBDOMAIN: "job", keys.TH_ADDRESS: "job-worker-1.job",
    }
    for name, value in overrides.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def test_a_good_environment_gives_every_peer_in_rank_order():
    gang = parse_gang(gang_env())
    assert gang.peers == (
        Peer("master", 0, 0, "job-master-0.job"),
        Peer("worker", 0, 1, "job-worker-0.job"),
        Peer("worker", 1, 2, "job-worker-1.job"),
        Peer("worker", 2, 3, "job-worker-2.job"),
    )
    assert (gang.rank, gang.me, gang.size) == (2, gang.peers[2], 4)
    assert [p.rank for p in gang.others] == [0, 1, 3]
    assert (gang.job_name, gang.namespace, gang.framework) == ("job", "ns", "pytorch")


def test_unset_options_take_the_documented_defaults():
    gang = parse_gang(gang_env(**{keys.TH_ADDRESS: None, keys.TH_RANK: None}))
    assert gang.port == keys.DEFAULT_PORT["pytorch"]
    assert (gang.gang_wait, gang.gang_wait_port, gang.wait_timeout) == ("dns", keys.GANG_WAIT_PORT, 600.0)
    assert gang.address == "job-worker-1.job"
    assert gang.rank == 2


def test_set_options_are_used():
    gang = parse_gang(gang_env(**{keys.TH_PORT: "1234", keys.TH_GANG_WAIT: "tcp", keys.TH_GANG_WAIT_PORT: "4000",
                                  keys.TH_WAIT_TIMEOUT: "2.5", keys.TH_ADDRESS: "custom.job"}))
    assert (gang.port, gang.gang_wait, gang.gang_wait_port, gang.wait_timeout) == (1234, "tcp", 4000, 2.5)
    assert gang.address == "custom.job"


def test_roles_are_ranked_in_the_order_the_shape_lists_them():
    gang = parse_gang(gang_env(**{
        keys.TH_FRAMEWORK: "tensorflow", keys.TH_REPLICAS: "chief=1,ps=2,worker=2",
        keys.TH_HOSTS: "chief=tf-chief,ps=tf-ps,worker=tf-worker", keys.TH_SUBDOMAIN: "tf",
        keys.TH_ROLE: "ps", keys.TH_INDEX: "1", keys.TH_RANK: "2", keys.TH_ADDRESS: None}))
    assert [(p.role, p.index, p.rank) for p in gang.peers] == [
        ("chief", 0, 0), ("ps", 0, 1), ("ps", 1, 2), ("worker", 0, 3), ("worker", 1, 4)]
    assert gang.address == "tf-ps-1.tf"


def test_a_role_with_no_members_needs_no_hostname_prefix():
    gang = parse_gang(gang_env(**{keys.TH_REPLICAS: "master=0,worker=2", keys.TH_HOSTS: "worker=job-worker",
                                  keys.TH_RANK: "1"}))
    assert [p.address for p in gang.peers] == ["job-worker-0.job", "job-worker-1.job"]


@pytest.mark.parametrize("name, value, expected", [
    (keys.TH_JOB_NAME, None, "not set: TRAINHOOK_JOB_NAME"),
    (keys.TH_NAMESPACE, "", "not set: TRAINHOOK_NAMESPACE"),
    (keys.TH_FRAMEWORK, "caffe", "TRAINHOOK_FRAMEWORK='caffe': not a framework"),
    (keys.TH_REPLICAS, "master=x", "TRAINHOOK_REPLICAS='master=x': counts must be non-negative integers"),
    (keys.TH_REPLICAS, "master", "TRAINHOOK_REPLICAS='master': cannot parse"),
    (keys.TH_REPLICAS, "worker=1,worker=2", "role 'worker' appears twice"),
    (keys.TH_REPLICAS, "master=0,worker=0", "the gang has no members"),
    (keys.TH_INDEX, "3", "TRAINHOOK_INDEX='3': role 'worker' has only 3 member(s)"),
    (keys.TH_INDEX, "one", "TRAINHOOK_INDEX='one': not an integer"),
    (keys.TH_RANK, "3", "TRAINHOOK_RANK='3': worker-1 has rank 2"),
    (keys.TH_ROLE, "ps", "TRAINHOOK_ROLE='ps': not a role with members"),
    (keys.TH_HOSTS, "master=job-master", "no hostname prefix for role 'worker'"),
    (keys.TH_GANG_WAIT, "http", "TRAINHOOK_GANG_WAIT='http': use one of dns, tcp, none"),
    (keys.TH_GANG_WAIT_PORT, "0", "TRAINHOOK_GANG_WAIT_PORT='0': out of range 1..65535"),
    (keys.TH_WAIT_TIMEOUT, "soon", "TRAINHOOK_WAIT_TIMEOUT='soon': not a number"),
    (keys.TH_PORT, "70000", "TRAINHOOK_PORT='70000': out of range"),
])
def test_a_bad_variable_is_named_in_the_error(name, value, expected):
    with pytest.raises(ConfigError) as error:
        parse_gang(gang_env(**{name: value}))
    assert expected in str(error.value)


def test_every_problem_is_reported_at_once():
    with pytest.raises(ConfigError) as error:
        parse_gang(gang_env(**{keys.TH_JOB_NAME: None, keys.TH_SUBDOMAIN: None, keys.TH_GANG_WAIT: "http"}))
    assert error.value.problems[0].startswith("not set: TRAINHOOK_JOB_NAME, TRAINHOOK_SUBDOMAIN (")
    assert "TRAINHOOK_GANG_WAIT='http'" in error.value.problems[1]
    assert len(error.value.problems) == 2


def launch(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TRAINHOOK_")}
    return subprocess.run(LAUNCH + args, env={**clean, **env}, capture_output=True, text=True, timeout=20)


def test_the_cli_reports_a_bad_environment_in_one_line_with_exit_code_2():
    result = launch(["wait"], gang_env(**{keys.TH_REPLICAS: None, keys.TH_INDEX: "x"}))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert lines[0].startswith("trainhook-launch wait: error: not set: TRAINHOOK_REPLICAS")
    assert "TRAINHOOK_INDEX='x'" in lines[0]


def test_wait_flags_replace_the_variables_they_stand_for():
    result = launch(["wait", "--mode", "none"], gang_env(**{keys.TH_GANG_WAIT: "tcp"}))
    assert result.returncode == 0
    assert "gang wait is off" in result.stdout


def test_run_without_a_command_is_a_usage_error():
    result = launch(["run", "--"], {})
    assert result.returncode == 2
    assert "run needs a command" in result.stderr and "Traceback" not in result.stderr


def test_help_explains_every_command():
    result = launch(["--help"], {})
    assert result.returncode == 0
    for command in ("wait", "run", "torchrun"):
        assert command in result.stdout
    for command in ("wait", "run", "torchrun"):
        sub = launch([command, "--help"], {})
        assert sub.returncode == 0 and f"usage: trainhook-launch {command}" in sub.stdout
