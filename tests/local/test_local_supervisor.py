"""trainhook local: the supervisor runs pods' containers and ends the run as a gang (real processes, root)."""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import time
import uuid

import pytest

from trainhook.gang import keys
from trainhook.local.envvars import base_env
from trainhook.local.network import Network
from trainhook.local.pods import ContainerSpec, LocalPod
from trainhook.local.supervisor import EXIT_TIMEOUT, Output, Supervisor


@pytest.fixture(scope="module")
def network():
    net = Network()
    net.open()
    try:
        yield net
    finally:
        assert net.close() == []


def container(name, script, kind="main", training=None, rank=None):
    env = base_env("")
    if rank is not None:
        env[keys.TH_RANK] = str(rank)
    training = kind == "main" if training is None else training
    return ContainerSpec(name, kind, ["sh", "-c", script], env, training=training)


def pod(network, tmp_path, name, *containers, init=(), grace=5.0):
    net = network.add_pod()
    hosts = tmp_path / f"{name}.hosts"
    hosts.write_text(f"127.0.0.1 localhost\n{net.ip} {name}\n")
    for spec in list(init) + list(containers):
        spec.env["HOSTNAME"] = name
    return LocalPod(name, "default", name, net.ip, net.netns_path, str(hosts), list(init), list(containers), grace)


def supervise(tmp_path, pods, timeout=None, grace=None):
    out = io.BytesIO()
    result = asyncio.run(Supervisor(pods, Output(out, tmp_path / "logs"), timeout, grace).run())
    return result, out.getvalue().decode()


def test_all_pods_succeed_with_prefixed_output_and_logs(network, tmp_path):
    script = "echo hello from $HOSTNAME on $(hostname); printf 'no newline'"
    pods = [pod(network, tmp_path, f"w-{i}", container("c", script, rank=i)) for i in range(2)]
    result, out = supervise(tmp_path, pods)
    assert result.exit_code == 0 and result.reason == "Succeeded"
    lines = out.splitlines()
    assert "[w-0] hello from w-0 on w-0" in lines and "[w-1] hello from w-1 on w-1" in lines
    assert "[w-1] no newline" in lines
    assert [(p.name, p.rank, p.exit_code, p.reason) for p in result.pods] == [
        ("w-0", "0", 0, "Completed"), ("w-1", "1", 0, "Completed")]
    assert all(p.duration is not None and p.duration >= 0 for p in result.pods)
    assert (tmp_path / "logs/w-0/c.log").read_text() == "hello from w-0 on w-0\nno newline"


def test_stdout_and_stderr_interleave_by_whole_lines_as_a_kubelet_logs_them(network, tmp_path):
    """A line written in two pieces stays whole while the other stream writes between them (Python's print()
    under PYTHONUNBUFFERED writes a line and its newline apart): CRI splits each stream at its own newlines.
    A line longer than 16 KiB comes in pieces, as CRI logs it, and is whole again in the log file."""
    script = ("printf 'half '; sleep 0.3; echo 'from stderr' >&2; sleep 0.3; echo 'and the rest'; "
              "head -c 40000 /dev/zero | tr '\\0' x; echo")
    result, out = supervise(tmp_path, [pod(network, tmp_path, "p", container("c", script, rank=0))])
    assert result.exit_code == 0, out
    lines = out.splitlines()
    assert lines.index("[p] from stderr") < lines.index("[p] half and the rest"), out
    assert [len(line) for line in lines if line.startswith("[p] xx")] == [4 + 16384, 4 + 16384, 4 + 40000 - 32768]
    assert (tmp_path / "logs/p/c.log").read_text() == "from stderr\nhalf and the rest\n" + "x" * 40000 + "\n"


def test_init_containers_run_in_order_before_the_containers(network, tmp_path):
    marker = tmp_path / "order"
    inits = [container("first", f"echo first >> {marker}", kind="init"),
             container("second", f"echo second >> {marker}", kind="init")]
    mains = [container("c", f"echo main >> {marker}"), container("side", "echo side-output", training=False)]
    result, out = supervise(tmp_path, [pod(network, tmp_path, "p", *mains, init=inits)])
    assert result.exit_code == 0
    lines = marker.read_text().splitlines()
    assert lines[:2] == ["first", "second"] and lines[2] == "main"
    assert "[p/side] side-output" in out.splitlines()


def test_a_failing_training_container_stops_the_gang(network, tmp_path):
    pods = [pod(network, tmp_path, "ok", container("c", "exec sleep 60")),
            pod(network, tmp_path, "bad", container("c", "sleep 0.5; echo giving up; exit 3"))]
    started = time.monotonic()
    result, out = supervise(tmp_path, pods)
    assert time.monotonic() - started < 20
    assert result.exit_code == 3 and result.reason == "Failed"
    assert result.first_failure == "bad/c exited with 3"
    by_name = {p.name: p for p in result.pods}
    assert (by_name["bad"].exit_code, by_name["bad"].reason) == (3, "Error")
    assert (by_name["ok"].exit_code, by_name["ok"].reason) == (143, "Terminated")  # SIGTERM
    assert "[bad] giving up" in out


def test_a_container_ignoring_sigterm_is_killed_after_the_grace_period(network, tmp_path):
    stubborn = container("c", "trap '' TERM; echo ready; while :; do sleep 0.1; done")
    pods = [pod(network, tmp_path, "stubborn", stubborn, grace=1.0),
            pod(network, tmp_path, "bad", container("c", "sleep 1; exit 1"))]
    started = time.monotonic()
    result, _ = supervise(tmp_path, pods)
    assert time.monotonic() - started < 15
    assert result.exit_code == 1
    assert result.pods[0].exit_code == 137  # SIGKILL


def test_a_failed_init_container_fails_the_pod_and_its_containers_never_start(network, tmp_path):
    never = tmp_path / "never"
    pods = [pod(network, tmp_path, "p", container("c", f"touch {never}"),
                init=[container("wait", "exit 5", kind="init")])]
    result, out = supervise(tmp_path, pods)
    assert result.exit_code == 5 and result.first_failure == "p/wait exited with 5"
    assert result.pods[0].reason == "Init:Error" and result.pods[0].exit_code == 5
    assert not never.exists()


def test_the_timeout_stops_everything_with_124(network, tmp_path):
    result, _ = supervise(tmp_path, [pod(network, tmp_path, "slow", container("c", "exec sleep 60"))], timeout=1)
    assert result.exit_code == EXIT_TIMEOUT and result.reason == "Timeout"
    assert result.pods[0].reason == "Terminated"


def test_a_non_training_container_failure_fails_the_run_without_stopping_it(network, tmp_path):
    pods = [pod(network, tmp_path, "p", container("c", "sleep 1; echo done"),
                container("helper", "exit 2", training=False))]
    result, out = supervise(tmp_path, pods)
    assert "[p] done" in out  # the training container ran to its end
    assert result.exit_code == 2 and result.first_failure == "p/helper exited with 2"


def test_sidecars_are_stopped_when_the_containers_end(network, tmp_path):
    sidecar = container("proxy", "echo proxy up; exec sleep 60", kind="sidecar")
    started = time.monotonic()
    result, out = supervise(tmp_path, [pod(network, tmp_path, "p", container("c", "sleep 0.5"), init=[sidecar])])
    assert time.monotonic() - started < 15
    assert result.exit_code == 0 and result.pods[0].reason == "Completed"
    assert "[p/proxy] proxy up" in out


def test_processes_left_behind_by_a_container_are_killed_with_it(network, tmp_path):
    tag = uuid.uuid4().hex
    script = f"sh -c 'sleep 300; : {tag}' & sleep 0.3; echo started"  # the child outlives the main process
    started = time.monotonic()
    result, out = supervise(tmp_path, [pod(network, tmp_path, "p", container("c", script))])
    assert time.monotonic() - started < 20  # the child holding the output pipe does not keep the run alive
    assert result.exit_code == 0 and "[p] started" in out
    time.sleep(0.2)
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert tag not in ps


def test_a_command_that_cannot_run_reports_127(network, tmp_path):
    spec = ContainerSpec("c", "main", ["/no/such/binary"], base_env("p"), training=True)
    result, out = supervise(tmp_path, [pod(network, tmp_path, "p", spec)])
    assert result.exit_code == 127
    assert "executable file not found" in out
    assert os.path.exists(tmp_path / "logs/p/c.log")
