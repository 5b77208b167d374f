"""A launcher with nothing to do sleeps until something happens (member_run.py `until_timers`, issue 32): its main
thread used to wake every 0.2 s whatever happened, ~0.75 ms of CPU a second for each launcher waiting for its gang
or beside hours of training. Counted, not timed: the main thread's voluntary context switches (one per sleep)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from gang_notary import GangNotary, indexed_job
from trainhook.launcher import deliver
from webhook_process import free_port


def main_thread_sleeps(pid: int) -> int:
    with open(f"/proc/{pid}/task/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches:"))


def test_a_member_waiting_for_its_coordinator_does_not_wake_five_times_a_second(tmp_path):
    launcher = tmp_path / "launcher.pyz"
    launcher.write_bytes(deliver.build_zip())
    with GangNotary(tmp_path / "run") as notary:
        pods = notary.admit(indexed_job("g", "team-a", completions=3, command=["true"]))
        env = {**notary.env(pods[1]), "PATH": "/usr/bin:/bin", "TRAINHOOK_COORDINATOR_PORT": str(free_port())}
        proc = subprocess.Popen([sys.executable, "-I", str(launcher), "run", "--", "true"], env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            lines = []
            for line in proc.stderr:  # rank 0 never comes: the member keeps trying it, its main loop waits
                lines.append(line)
                if "the gang's coordinator" in line:
                    break
            assert proc.poll() is None, "".join(lines)
            before = main_thread_sleeps(proc.pid)
            time.sleep(3.0)
            woke = main_thread_sleeps(proc.pid) - before
            assert proc.poll() is None, "".join(lines)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(10)
            finally:
                proc.kill()
                proc.stderr.close()
    assert woke <= 3, f"the main thread slept and woke {woke} times in 3 s with nothing to do"
    # SIGTERM still ends the wait at once (the signal handler feeds the queue the loop blocks on).
    assert code == 128 + signal.SIGTERM, code
