"""The launcher <-> worker control channel, for real: `trainhook-launch mpi-worker` as a process, the launcher's
own client code (mpi_control.connect_worker, mpi_launch.run_mpi) on the other end, over TCP on this machine.

What it guarantees: a worker exits with the launcher's outcome, or 129 when its launcher hangs up or never comes
(no worker outlives its launcher); only a holder of the gang's key can attach or end it; a launcher stops
mpirun at once when a worker goes away. The worker gets the key as a pod does, from a notary over HTTPS with its
identity token (the real webhook's notary over a real MPI gang: tests/support/gang_notary.py); nothing in its
environment is the key."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from gang_notary import MpiGangCredentials
from trainhook.launcher.mpi import control
from trainhook.launcher.mpi import launch as mpi_launch
from trainhook.launcher.pod_view import Peer, parse_gang
from webhook_process import free_port

SHAPE = {"TRAINHOOK_FRAMEWORK": "mpi", "TRAINHOOK_JOB_NAME": "pi", "TRAINHOOK_NAMESPACE": "team-a",
         "TRAINHOOK_REPLICAS": "launcher=1,worker=1", "TRAINHOOK_HOSTS": "launcher=pi-launcher,worker=pi-worker",
         "TRAINHOOK_SUBDOMAIN": "pi"}
NO_AGENT = control.Setup("kubexec", "")
# The real webhook's notary over a real MPI gang (Jobs pi-launcher and pi-worker, admitted by the webhook), for
# every test here: each worker presents the worker pod's token, the launcher side holds the launcher pod's key.
CREDENTIALS = MpiGangCredentials()
mpi_notary = CREDENTIALS.fixture()


def gang_env(role: str, port: int, **more: str) -> dict[str, str]:
    """A Job's pod (restartPolicy Never): the worker exits once the gang is done."""
    return {"PATH": os.environ["PATH"], **SHAPE, "TRAINHOOK_ROLE": role, "TRAINHOOK_INDEX": "0",
            "TRAINHOOK_RANK": "0" if role == "launcher" else "1", "TRAINHOOK_PORT": str(port),
            "TRAINHOOK_WAIT_TIMEOUT": "30", "TRAINHOOK_MPI_SLOTS": "3", **CREDENTIALS.worker_env,
            "TRAINHOOK_WORKLOAD": "Job/pi-worker", "TRAINHOOK_RESTART_POLICY": "Never", **more}


class Worker:
    """`trainhook-launch mpi-worker [-- SERVICE]` as a process, and the launcher's side of its channel."""

    def __init__(self, *service: str, prefix: tuple[str, ...] = (), **env: str):
        self.port = free_port()
        argv = [sys.executable, "-m", "trainhook.launcher.cli", "mpi-worker"] + (["--", *service] if service else [])
        self.process = subprocess.Popen([*prefix, *argv], env=gang_env("worker", self.port, **env),
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.launcher = parse_gang(gang_env("launcher", self.port))
        self.peer = Peer("worker", 0, 1, "127.0.0.1")

    def connect(self, key: bytes | None = None, setup: control.Setup = NO_AGENT,
                timeout: float = 30) -> control.WorkerLink:
        """The launcher's handshake, with the gang's key unless `key` says otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return control.connect_worker(self.launcher, self.peer, self.port,
                                              CREDENTIALS.key if key is None else key, setup)
            except (ConnectionRefusedError, control.ControlError) as e:
                # Not listening yet, or listening without its key yet ("refused for now"): as the launcher does.
                if isinstance(e, control.WorkerRefused) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def finish(self, timeout: float = 15) -> tuple[int, str]:
        try:
            output, _ = self.process.communicate(timeout=timeout)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.communicate()
        return self.process.returncode, output


def test_a_worker_reports_its_slots_and_exits_with_the_launchers_outcome():
    worker = Worker()
    link = worker.connect()
    assert link.slots == 3
    link.tell_exit(7, "mpirun exited with 7")
    link.wait_bye(timeout=5)
    code, output = worker.finish()
    assert code == 7
    assert "launcher finished: mpirun exited with 7; exiting 7" in output


def test_a_statefulset_worker_parks_once_the_gang_is_done_and_exits_when_stopped():
    """Its container would be rerun (restartPolicy Always): it stays up, idle, until the pod is stopped."""
    worker = Worker(TRAINHOOK_WORKLOAD="StatefulSet/pi-worker", TRAINHOOK_RESTART_POLICY="Always")
    link = worker.connect()
    link.tell_exit(0, "mpirun exited with 0")
    link.wait_bye(timeout=5)
    time.sleep(1.5)
    assert worker.process.poll() is None, "a finished StatefulSet worker must not exit (it would be rerun)"
    worker.process.send_signal(signal.SIGTERM)
    code, output = worker.finish()
    assert code == 0
    assert "parked: the gang is done" in output and "stopped by SIGTERM while parked; exiting 0" in output


def test_a_worker_whose_launcher_hangs_up_exits_129_at_once():
    worker = Worker()
    link = worker.connect()
    started = time.monotonic()
    link.channel.close()
    code, output = worker.finish()
    assert code == control.EXIT_LAUNCHER_LOST == 129
    assert time.monotonic() - started < 5
    assert "the launcher's connection closed without an outcome; exiting 129" in output


def test_a_worker_whose_launcher_never_comes_exits_129_at_its_deadline():
    started = time.monotonic()
    code, output = Worker(TRAINHOOK_WAIT_TIMEOUT="1").finish()
    assert code == 129 and 1 <= time.monotonic() - started < 10
    assert "no launcher connected within 1s" in output


def test_only_a_holder_of_the_gangs_key_can_attach():
    worker = Worker()
    with pytest.raises(control.WorkerRefused, match="does not hold this gang's key"):
        worker.connect(key=b"b" * 64)
    link = worker.connect()  # the worker is still waiting for its real launcher
    link.tell_exit(0, "done")
    code, output = worker.finish()
    assert code == 0
    assert "refused a connection from" in output and ": the launcher does not hold this gang's" in output


def test_a_connection_that_never_says_hello_holds_up_nobody():
    worker = Worker()
    deadline = time.monotonic() + 30
    while True:
        try:
            silent = socket.create_connection(("127.0.0.1", worker.port))
            break
        except ConnectionRefusedError:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    started = time.monotonic()
    link = worker.connect()
    assert time.monotonic() - started < 2
    link.tell_exit(0, "done")
    assert worker.finish()[0] == 0
    silent.close()


def test_a_worker_serves_one_launcher():
    worker = Worker()
    first = worker.connect()
    with pytest.raises(control.WorkerRefused, match="this worker already serves a launcher"):
        worker.connect()
    first.tell_exit(0, "done")
    assert worker.finish()[0] == 0


def test_a_launcher_of_another_gang_is_refused():
    worker = Worker()
    worker.launcher = parse_gang({**gang_env("launcher", worker.port), "TRAINHOOK_JOB_NAME": "other"})
    with pytest.raises(control.WorkerRefused, match="launcher of gang team-a/other, not team-a/pi"):
        worker.connect()
    worker.launcher = parse_gang(gang_env("launcher", worker.port))
    worker.connect().tell_exit(0, "done")
    assert worker.finish()[0] == 0


def test_a_worker_writes_the_agent_only_under_etc_mpi():
    worker = Worker()
    with pytest.raises(control.WorkerRefused, match=r"the rsh agent must be in /etc/mpi/ \(not /usr/local/bin/evil\)"):
        worker.connect(setup=control.Setup("kubexec", "/usr/local/bin/evil"))
    with pytest.raises(control.WorkerRefused, match=r"must be in /etc/mpi/ \(not /etc/mpi/../cron.d/x\)"):
        worker.connect(setup=control.Setup("kubexec", "/etc/mpi/../cron.d/x"))
    worker.connect().tell_exit(0, "done")
    assert worker.finish()[0] == 0
    assert not os.path.exists("/usr/local/bin/evil")


def test_a_worker_installs_the_launchers_agent_in_its_own_etc_mpi():
    """In a private mount namespace with its own /etc/mpi, as a pod with trainhook's emptyDir has."""
    prefix = ("unshare", "--mount", "--propagation", "private", "sh", "-c",
              'mkdir -p /etc/mpi && mount -t tmpfs tmpfs /etc/mpi && exec "$@"', "sh")
    worker = Worker(prefix=prefix)
    link = worker.connect(setup=control.Setup("ssh", "/etc/mpi/kubexec.sh"))
    agent = f"/proc/{worker.process.pid}/root/etc/mpi/kubexec.sh"
    text = open(agent).read()
    assert "kubexec --transport ssh" in text and os.access(agent, os.X_OK)
    link.tell_exit(0, "done")
    assert worker.finish()[0] == 0


def test_the_workers_service_runs_for_its_lifetime_and_is_stopped_at_the_end(tmp_path):
    marker = tmp_path / "stopped"
    worker = Worker("sh", "-c", f"trap 'echo stopped > {marker}; exit 0' TERM; while :; do sleep 0.1; done")
    link = worker.connect()
    assert worker.process.poll() is None and not marker.exists()
    link.tell_exit(0, "done")
    assert worker.finish()[0] == 0
    assert marker.read_text() == "stopped\n"


def test_a_service_that_dies_fails_the_worker_with_its_code():
    code, output = Worker("sh", "-c", "sleep 0.5; exit 3").finish()
    assert code == 3
    assert "sh -c sleep 0.5; exit 3 exited with 3 before the launcher finished" in output


def test_sigterm_ends_a_worker_with_143():
    worker = Worker()
    link = worker.connect()  # held: a dropped link would end the worker with 129 first
    worker.process.send_signal(signal.SIGTERM)
    code, output = worker.finish()
    assert code == 143 and "stopped by SIGTERM" in output
    link.channel.close()


def test_the_launcher_stops_mpirun_when_a_worker_goes_away():
    worker = Worker()
    link = worker.connect()
    killer = threading.Timer(1.0, worker.process.kill)
    killer.start()
    started = time.monotonic()
    code, lost = mpi_launch.run_mpi(["sleep", "60"], dict(os.environ), [link])
    elapsed = time.monotonic() - started
    killer.join()
    worker.finish()
    assert lost and link.lost
    assert code == 128 + signal.SIGTERM  # mpirun (here: sleep) was told to stop
    assert elapsed < 5


def test_the_launcher_leaves_mpirun_alone_while_workers_stay():
    worker = Worker()
    link = worker.connect()
    code, lost = mpi_launch.run_mpi(["sh", "-c", "sleep 1; exit 5"], dict(os.environ), [link])
    assert (code, lost) == (5, False)
    mpi_launch.tell_workers([link], code, "mpirun exited with 5")
    assert worker.finish()[0] == 5


@pytest.mark.parametrize("implementation, abi", [("OpenMPI", "openmpi"), ("MPICH", "mpich"), ("Intel", "mpich")])
def test_the_ranks_are_pinned_to_the_gangs_mpi_and_a_users_own_choice_wins(tmp_path, implementation, abi):
    env = mpi_launch.launch_env({}, implementation, 1, tmp_path / "hostfile", tmp_path / "agent")
    assert env["MPI4PY_MPIABI"] == abi
    mine = mpi_launch.launch_env({"MPI4PY_MPIABI": "mpich"}, "OpenMPI", 1, tmp_path / "h", tmp_path / "a")
    assert mine["MPI4PY_MPIABI"] == "mpich"


def test_open_mpi_exports_the_abi_pin_to_remote_ranks_once():
    built = mpi_launch.build_command(["mpirun", "-np", "2", "python", "t.py"], "OpenMPI", 2, "pi-0.pi", root=False)
    assert built == ["mpirun", "-x", "MPI4PY_MPIABI", "-np", "2", "python", "t.py"]
    given = ["mpirun", "-x", "MPI4PY_MPIABI", "python", "t.py"]
    assert mpi_launch.build_command(given, "OpenMPI", 2, "pi-0.pi", root=False) == given
    # Hydra forwards the whole environment: nothing to add for MPICH beyond -localhost.
    hydra = mpi_launch.build_command(["mpiexec", "python", "t.py"], "MPICH", 2, "pi-0.pi", root=False)
    assert hydra == ["mpiexec", "-localhost", "pi-0.pi", "python", "t.py"]
