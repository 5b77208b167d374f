"""An attempt's processes end with it, including the ones that left its process group.

torchrun starts each worker in a session of its own (start_new_session), so SIGKILL to the training's process
group, which the launcher sends when a stopped training outlives its grace, missed them: a worker stuck in a
collective outlived its attempt and its gang's restart. These commands do what torchrun does (a child in a new
session) and check that the child is gone once the launcher has ended the attempt: stopped while the command lives,
and, as a container's PID 1 (a PID namespace of its own), after the command has exited by itself."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

from trainhook.launcher.process import Training, descendants

# The command: a worker in a session of its own that sleeps (its pid in a file), then the command itself ignores
# SIGTERM (torchrun in its exit barrier) unless told to exit at once.
COMMAND = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    with open(sys.argv[1] + ".tmp", "w") as f:
        f.write(str(worker.pid))
    os.rename(sys.argv[1] + ".tmp", sys.argv[1])
    if sys.argv[2] == "exit":
        sys.exit(0)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(300)
""")


def alive(pid: int) -> bool:
    """Running and not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:].split()[0] != b"Z"


def wait_for_file(path: str, timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"{path} was not written"
        time.sleep(0.05)
    with open(path) as f:
        return f.read()


def test_descendants_follow_parent_links_across_sessions(tmp_path):
    pidfile = str(tmp_path / "worker")
    proc = subprocess.Popen([sys.executable, "-c", COMMAND, pidfile, "stay"])
    try:
        worker = int(wait_for_file(pidfile))
        assert os.getpgid(worker) != os.getpgid(proc.pid)  # what the group kill alone missed
        assert worker in descendants(proc.pid) and worker in descendants(os.getpid())
        assert proc.pid not in descendants(worker)
    finally:
        proc.kill()
        proc.wait()
        os.kill(worker, signal.SIGKILL)


def test_a_stopped_training_takes_its_workers_in_other_sessions_with_it(tmp_path):
    pidfile = str(tmp_path / "worker")
    exited = threading.Event()
    codes: list[int] = []
    training = Training([sys.executable, "-c", COMMAND, pidfile, "stay"], dict(os.environ),
                        lambda code: (codes.append(code), exited.set()))
    assert training.start() is None
    worker = int(wait_for_file(pidfile))
    try:
        training.signal(signal.SIGTERM)  # ignored, as torchrun in its exit barrier does
        time.sleep(0.3)
        assert not exited.is_set() and alive(worker)
        training.kill_group()  # what the launcher does when the stop grace has passed
        assert exited.wait(10), "the command outlived SIGKILL"
        assert codes == [128 + signal.SIGKILL]
        deadline = time.monotonic() + 10
        while alive(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(worker), "the worker in its own session outlived the stopped attempt"
    finally:
        if alive(worker):
            os.kill(worker, signal.SIGKILL)


# As PID 1 of a PID namespace: the command exits by itself, its worker was handed to us; the attempt's end
# takes it. The result is written where the test reads it, since the namespace's processes die with its PID 1.
AS_PID1 = textwrap.dedent("""
    import os, sys, threading, time
    from trainhook.launcher.process import Training
    assert os.getpid() == 1, os.getpid()
    done = threading.Event()
    training = Training([sys.executable, "-c", sys.argv[1], sys.argv[2], "exit"], dict(os.environ),
                        lambda code: done.set())
    assert training.start() is None
    assert done.wait(30)
    worker = int(open(sys.argv[2]).read())
    deadline = time.monotonic() + 10
    def alive():
        try:
            stat = open(f"/proc/{worker}/stat", "rb").read()
        except OSError:
            return False
        return stat[stat.rfind(b")") + 2:].split()[0] != b"Z"
    while alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    print("worker alive" if alive() else "worker gone", flush=True)
""")


def test_as_pid_1_an_exited_trainings_leftover_workers_are_ended(tmp_path):  # root: a PID namespace (as CI)
    pidfile = str(tmp_path / "worker")
    result = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", AS_PID1, COMMAND,
                             pidfile], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "worker gone", result.stdout + result.stderr
