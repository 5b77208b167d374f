"""`trainhook-launch run`: exit codes kept, signals forwarded, orphans reaped when the launcher is PID 1."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

LAUNCH = [sys.executable, "-m", "trainhook.launcher.cli"]


def run(cmd: list[str], timeout: float = 20) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LAUNCH, "run", "--", *cmd], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("code", [0, 3, 127])
def test_the_exit_code_is_the_commands_own(code):
    assert run([sys.executable, "-c", f"raise SystemExit({code})"]).returncode == code


def test_a_command_killed_by_a_signal_exits_128_plus_the_signal():
    result = run([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    assert result.returncode == 128 + signal.SIGKILL


def test_a_command_that_does_not_exist_exits_127_with_a_message():
    result = run(["/nonexistent/train"])
    assert result.returncode == 127
    assert "command not found: /nonexistent/train" in result.stderr


# Installs a handler for every forwarded signal, says it is ready, and exits 100+N when signal N arrives. It sleeps
# in short slices: Python runs a handler between bytecodes, so a signal landing after "ready" and before one long
# sleep's system call began would wait out the whole sleep (CI saw it: 1 run in about 500 on a loaded machine).
CATCHER = textwrap.dedent("""
    import signal, sys, time
    def caught(signum, frame):
        print(f"got {signum}", flush=True)
        sys.exit(100 + signum)
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(s, caught)
    print("ready", flush=True)
    for _ in range(300):
        time.sleep(0.1)
    sys.exit(1)
""")


def start(cmd: list[str]) -> subprocess.Popen[str]:
    """Start the launcher and wait for the command's "ready" line, so its handlers are in place."""
    proc = subprocess.Popen([*LAUNCH, "run", "--", *cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2])
def test_a_signal_to_the_launcher_reaches_the_command(signum):
    proc = start([sys.executable, "-c", CATCHER])
    proc.send_signal(signum)
    out, _ = proc.communicate(timeout=20)
    assert out.strip() == f"got {int(signum)}"
    assert proc.returncode == 100 + signum


def test_sigterm_to_the_launcher_ends_a_command_without_handlers_with_143():
    proc = start(["sh", "-c", "echo ready; exec sleep 30"])
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=20)
    assert proc.returncode == 143


# The command leaves an orphan (a `sleep` whose parent shell has exited), which the kernel re-parents to PID 1,
# then kills it: a dead orphan stays a zombie until PID 1 reaps it. The command reports what became of it,
# waiting up to argv[1] seconds for it to disappear.
ORPHAN_MAKER = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    pid = int(subprocess.run(["sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True).stdout)
    def state():
        try:
            status = open(f"/proc/{pid}/status").read()
        except FileNotFoundError:
            return "gone"
        fields = dict(line.split(":", 1) for line in status.splitlines())
        state = "zombie" if fields["State"].split()[0] == "Z" else "alive"
        return f"{state}, parent {fields['PPid'].strip()}"
    print("orphan", state(), flush=True)
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + float(sys.argv[1])
    while state() != "gone" and time.monotonic() < deadline:
        time.sleep(0.05)
    print("killed", state(), flush=True)
""")


def in_pid_namespace(cmd: list[str]) -> list[str]:
    """`cmd` as PID 1 of a new PID namespace, with its own /proc (a container's view)."""
    return ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", *cmd]


def test_orphans_are_reaped_when_the_launcher_is_pid_1():
    result = subprocess.run(in_pid_namespace([*LAUNCH, "run", "--", sys.executable, "-c", ORPHAN_MAKER, "10"]),
                            capture_output=True, text=True, timeout=20)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "orphan alive, parent 1"  # the orphan really was the launcher's to reap
    assert lines[1] == "killed gone"


def test_without_the_launcher_as_pid_1_the_orphan_stays_a_zombie():
    """The control for the test above: the same command under a PID 1 that does not reap leaves a zombie."""
    pid1 = [sys.executable, "-c", "import subprocess, sys; sys.exit(subprocess.call(sys.argv[1:]))"]
    result = subprocess.run(in_pid_namespace([*pid1, sys.executable, "-c", ORPHAN_MAKER, "1"]),
                            capture_output=True, text=True, timeout=20)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["orphan alive, parent 1", "killed zombie, parent 1"]
