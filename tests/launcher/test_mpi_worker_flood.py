"""mpi-worker's listener under a hostile crowd (issue 23 item 2, applied to the worker): 400 unauthenticated
connections that each send one byte every 8 s, against a real `trainhook-launch mpi-worker` process.

Before mpi_doorman, the limit was per read (one byte every 8 s held a connection forever) and every connection
had its own thread. Now: threads and open connections stay bounded (MAX_PENDING), every such connection is closed
within the whole-handshake deadline, the log stays short, and the real launcher connects during the flood and
the run ends with its outcome."""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import time

from gang_notary import MpiGangCredentials
from trainhook.launcher.mpi import control
from trainhook.launcher.mpi import doorman as mpi_doorman
from trainhook.launcher.pod_view import Peer, parse_gang
from webhook_process import free_port

CROWD = 400
DRIP = 8.0
ENV = {"TRAINHOOK_FRAMEWORK": "mpi", "TRAINHOOK_JOB_NAME": "pi", "TRAINHOOK_NAMESPACE": "team-a",
       "TRAINHOOK_REPLICAS": "launcher=1,worker=1", "TRAINHOOK_HOSTS": "launcher=pi-launcher,worker=pi-worker",
       "TRAINHOOK_SUBDOMAIN": "pi", "TRAINHOOK_INDEX": "0", "TRAINHOOK_WAIT_TIMEOUT": "120",
       "TRAINHOOK_WORKLOAD": "Job/pi-worker", "TRAINHOOK_RESTART_POLICY": "Never"}
# The worker pod of a real MPI gang (a launcher and one worker, admitted by the real webhook): the notary's URL and
# CA the webhook injected and the pod's own token; and the gang's key, as the launcher's pod gets it.
CREDENTIALS = MpiGangCredentials()
mpi_notary = CREDENTIALS.fixture()


def threads_and_sockets(pid: int) -> tuple[int, int]:
    threads = len(os.listdir(f"/proc/{pid}/task"))
    sockets = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            sockets += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return threads, sockets


def test_a_crowd_dripping_one_byte_every_8s_is_bounded_closed_in_time_and_the_launcher_still_gets_in():
    notary_env, key = CREDENTIALS.worker_env, CREDENTIALS.key
    port = free_port()
    env = {"PATH": os.environ["PATH"], **ENV, **notary_env, "TRAINHOOK_ROLE": "worker", "TRAINHOOK_RANK": "1",
           "TRAINHOOK_PORT": str(port)}
    worker = subprocess.Popen([sys.executable, "-m", "trainhook.launcher.cli", "mpi-worker"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    crowd: dict[socket.socket, float] = {}  # socket -> when it connected
    closed_after: list[float] = []
    try:
        deadline = time.monotonic() + 30
        while len(crowd) < CROWD:
            try:
                sock = socket.create_connection(("127.0.0.1", port))
            except ConnectionRefusedError:
                assert time.monotonic() < deadline, "the worker never listened"
                time.sleep(0.05)
                continue
            sock.sendall(b"{")  # the start of a hello that never ends
            crowd[sock] = time.monotonic()
        flood_started = min(crowd.values())
        peak = (0, 0)
        launcher_in = None
        last_drip = time.monotonic()
        launcher = parse_gang({**ENV, "TRAINHOOK_ROLE": "launcher", "TRAINHOOK_RANK": "0",
                               "TRAINHOOK_PORT": str(port)})
        while crowd and time.monotonic() - flood_started < 40:
            threads, sockets = threads_and_sockets(worker.pid)
            peak = (max(peak[0], threads), max(peak[1], sockets))
            if launcher_in is None and time.monotonic() - flood_started > 3:
                # Mid-flood, with the pending slots full of drippers: the real launcher's handshake.
                launcher_in = control.connect_worker(launcher, Peer("worker", 0, 1, "127.0.0.1"), port, key,
                                              control.Setup("gang", ""))
            readable, _, _ = select.select(list(crowd), [], [], 0.5)
            for sock in readable:
                try:
                    data = sock.recv(4096)
                except OSError:
                    data = b""
                if not data:
                    closed_after.append(time.monotonic() - crowd.pop(sock))
                    sock.close()
            if time.monotonic() - last_drip >= DRIP:
                last_drip = time.monotonic()
                for sock in list(crowd):
                    try:
                        sock.sendall(b" ")
                    except OSError:
                        pass
        assert not crowd, f"{len(crowd)} dripping connections still open after 40s"
        assert len(closed_after) == CROWD
        # The whole-handshake deadline, not per read: even connections that kept dripping were closed in time.
        assert max(closed_after) < mpi_doorman.HANDSHAKE_DEADLINE + 4, max(closed_after)
        threads, sockets = peak
        assert threads <= mpi_doorman.MAX_PENDING + 8, f"{threads} threads"
        assert sockets <= mpi_doorman.MAX_PENDING + 8, f"{sockets} open sockets"
        assert launcher_in is not None and launcher_in.slots == 1
        launcher_in.tell_exit(0, "mpirun exited with 0")
        launcher_in.wait_bye(timeout=5)
        output, _ = worker.communicate(timeout=30)
        assert worker.returncode == 0, output
        lines = output.splitlines()
        assert "trainhook-launch mpi-worker: launcher connected from 127.0.0.1" in lines
        assert len(lines) < 30, f"{len(lines)} log lines for {CROWD} refused connections:\n{output}"
        assert any("more refused or dropped connection(s) not logged" in line for line in lines), output
    finally:
        for sock in crowd:
            sock.close()
        if worker.poll() is None:
            worker.kill()
            worker.communicate()


def test_the_accept_loop_survives_running_out_of_file_descriptors():
    """With 40 file descriptors allowed (fewer than MAX_PENDING), a crowd makes accept() fail with EMFILE; the
    loop backs off and goes on, and once the crowd is gone the launcher connects."""
    notary_env, key = CREDENTIALS.worker_env, CREDENTIALS.key
    port = free_port()
    env = {"PATH": os.environ["PATH"], **ENV, **notary_env, "TRAINHOOK_ROLE": "worker", "TRAINHOOK_RANK": "1",
           "TRAINHOOK_PORT": str(port)}
    limits = ["prlimit", "--nofile=40"]
    worker = subprocess.Popen([*limits, sys.executable, "-m", "trainhook.launcher.cli", "mpi-worker"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    crowd = []
    try:
        deadline = time.monotonic() + 30
        while len(crowd) < 120:
            try:
                crowd.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            except ConnectionRefusedError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            except OSError:
                break  # the backlog is full: the worker is not accepting (out of descriptors)
        time.sleep(2)
        assert worker.poll() is None, worker.communicate()[0]
        for sock in crowd:
            sock.close()
        crowd.clear()
        launcher = parse_gang({**ENV, "TRAINHOOK_ROLE": "launcher", "TRAINHOOK_RANK": "0",
                               "TRAINHOOK_PORT": str(port)})
        deadline = time.monotonic() + 30
        while True:
            try:
                link = control.connect_worker(launcher, Peer("worker", 0, 1, "127.0.0.1"), port, key,
                                       control.Setup("gang", ""))
                break
            except (OSError, control.ControlError):
                assert time.monotonic() < deadline, "the worker stopped accepting"
                time.sleep(0.5)
        link.tell_exit(0, "done")
        output, _ = worker.communicate(timeout=30)
        assert worker.returncode == 0, output
        assert "cannot accept a connection: Too many open files" in output
        assert len(output.splitlines()) < 40, output
    finally:
        for sock in crowd:
            sock.close()
        if worker.poll() is None:
            worker.kill()
            worker.communicate()
