"""The `gang` transport for real: `trainhook-launch mpi-worker` as a process (its key from an HTTPS notary, as a
pod gets it), the launcher's doorway (gang_transport.Doorway, this test playing the launcher) and the rsh agent
(`trainhook-launch kubexec --transport gang`) as a process, called as mpirun calls ssh.

What it guarantees: the agent behaves as ssh would to mpirun (stdout, stderr, stdin, the exit code, the remote
shell's quoting, the container's environment); killing the agent kills the remote command; the command's end
ends the agent; and nobody without the gang's key, or without the launcher's uid, gets a command run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from gang_notary import MpiGangCredentials
from trainhook.launcher.mpi import control
from trainhook.launcher.mpi import gang_transport
from trainhook.launcher.pod_view import Peer, parse_gang
from webhook_process import free_port

SHAPE = {"TRAINHOOK_FRAMEWORK": "mpi", "TRAINHOOK_JOB_NAME": "pi", "TRAINHOOK_NAMESPACE": "team-a",
         "TRAINHOOK_REPLICAS": "launcher=1,worker=1", "TRAINHOOK_HOSTS": "launcher=pi-launcher,worker=pi-worker",
         "TRAINHOOK_SUBDOMAIN": "pi", "TRAINHOOK_WORKLOAD": "Job/pi-worker", "TRAINHOOK_RESTART_POLICY": "Never"}
# The real webhook's notary over a real MPI gang (Jobs pi-launcher and pi-worker, admitted by the webhook): the
# worker process presents the worker pod's token, this test's launcher side holds the launcher pod's key.
CREDENTIALS = MpiGangCredentials()
mpi_notary = CREDENTIALS.fixture()


def gang_env(role: str, port: int) -> dict[str, str]:
    return {"PATH": os.environ["PATH"], **SHAPE, "TRAINHOOK_ROLE": role, "TRAINHOOK_INDEX": "0",
            "TRAINHOOK_RANK": "0" if role == "launcher" else "1", "TRAINHOOK_PORT": str(port),
            "TRAINHOOK_WAIT_TIMEOUT": "60", "TRAINHOOK_MPI_SLOTS": "3"}


class Gang:
    """One worker process, its launcher's control link, and the launcher's doorway."""

    def __init__(self, with_key: bool = True, attach: bool = True):
        self.port = free_port()
        env = {**gang_env("worker", self.port), **(CREDENTIALS.worker_env if with_key else {})}
        self.worker = subprocess.Popen([sys.executable, "-m", "trainhook.launcher.cli", "mpi-worker"], env=env,
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        launcher = parse_gang(gang_env("launcher", self.port))
        self.peer = Peer("worker", 0, 1, "127.0.0.1")
        self.launcher = launcher.replace(peers=(launcher.peers[0], self.peer))
        self.key = CREDENTIALS.key if with_key else b""
        self.link = self.connect() if attach else None
        # A short path (a unix socket's is limited to 107 bytes) in a directory others may traverse, so that the
        # doorway's own directory mode is what keeps them out.
        self.root = Path(tempfile.mkdtemp(prefix="th-gang-"))
        self.root.chmod(0o755)
        self.said: list[str] = []
        self.doorway = gang_transport.Doorway(self.launcher, self.key, self.port,
                                        gang_transport.doorway_path(self.root / "kubexec.sh"), say=self.said.append)
        self.doorway.__enter__()

    def connect(self) -> control.WorkerLink:
        deadline = time.monotonic() + 30
        while True:
            try:
                return control.connect_worker(self.launcher, self.peer, self.port, self.key, control.Setup("gang", ""))
            except (ConnectionRefusedError, control.ControlError) as e:
                if isinstance(e, control.WorkerRefused):  # ControlError alone: no key yet, "refused for now"
                    raise
                assert time.monotonic() < deadline, "the worker never listened"
                time.sleep(0.05)

    def agent(self, *words: str, host: str = "127.0.0.1", **popen) -> subprocess.Popen:
        argv = [sys.executable, "-m", "trainhook.launcher.cli", "kubexec", "--transport", "gang", "--doorway",
                str(self.doorway.path), "-o", "ConnectionAttempts=10", host, *words]
        popen.setdefault("stdin", subprocess.DEVNULL)
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)

    def run(self, *words: str, stdin: bytes = b"", **kwargs) -> subprocess.CompletedProcess:
        process = self.agent(*words, stdin=subprocess.PIPE, **kwargs)
        out, err = process.communicate(stdin, timeout=60)
        return subprocess.CompletedProcess(process.args, process.returncode, out, err)

    def finish(self) -> tuple[int, str]:
        self.doorway.__exit__(None, None, None)
        if self.link is not None:
            self.link.tell_exit(0, "done")
        try:
            output, _ = self.worker.communicate(timeout=15)
        finally:
            if self.worker.poll() is None:
                self.worker.kill()
                output, _ = self.worker.communicate()
        return self.worker.returncode, output


@pytest.fixture
def gang():
    started = Gang()
    yield started
    started.finish()


def test_the_agent_relays_stdout_stderr_and_the_exit_code_as_ssh_would(gang):
    # mpirun's words are for a remote shell: joined by spaces and run by /bin/sh -c, as ssh and kubexec run them.
    done = gang.run("echo", "out;", "echo", "err", ">&2;", "exit", "7")
    assert (done.returncode, done.stdout, done.stderr) == (7, b"out\n", b"err\n")
    assert gang.run("true").returncode == 0


def test_the_remote_shell_does_the_quoting_and_sees_the_worker_containers_environment(gang):
    done = gang.run("printf", "'[%s]'", '"a  b"', "c;", "echo", "$TRAINHOOK_MPI_SLOTS", "$TRAINHOOK_ROLE")
    assert done.stdout == b"[a  b][c]3 worker\n", done.stderr


def test_stdin_reaches_the_command_and_a_large_stream_comes_back_intact(gang):
    data = os.urandom(3 * 1024 * 1024 + 17)  # many frames both ways: the bounded buffers push back, lose nothing
    done = gang.run("cat", stdin=data)
    assert done.returncode == 0 and done.stdout == data, done.stderr


def test_the_exit_code_arrives_while_the_agent_still_sends_stdin_the_command_never_read(gang):
    # The worker closes while the agent's stdin is still on its way: closing with unread bytes would make the
    # kernel reset the connection, and a reset can overtake the EXIT frame (seen in CI: 255 instead of 7).
    for _ in range(3):
        done = gang.run("exit", "7", stdin=os.urandom(8 * 1024 * 1024))
        assert (done.returncode, done.stderr) == (7, b""), done.stderr


def test_a_command_killed_by_a_signal_ends_the_agent_with_128_plus_n(gang):
    assert gang.run("kill", "-TERM", "$$").returncode == 128 + signal.SIGTERM


def test_killing_the_agent_kills_the_remote_command_and_what_it_started(gang):
    agent = gang.agent("sleep 300 & echo $! $$; wait")
    line = agent.stdout.readline().split()
    child, shell = int(line[0]), int(line[1])
    assert Path(f"/proc/{child}").exists() and Path(f"/proc/{shell}").exists()
    agent.kill()  # SIGKILL: the agent gets no chance to say anything; its connection just closes
    agent.wait()
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in (child, shell)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(child) and not alive(shell), "the remote command outlived its agent"


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_the_commands_end_ends_the_agent_even_when_a_background_child_keeps_its_output_open(gang):
    started = time.monotonic()
    done = gang.run("sleep", "30", "&", "echo", "started")
    assert (done.returncode, done.stdout) == (0, b"started\n")
    assert time.monotonic() - started < 10


def test_the_worker_ends_whatever_it_spawned_when_it_ends(gang):
    agent = gang.agent("echo $$; exec sleep 300")
    pid = int(agent.stdout.readline())
    code, _ = gang.finish()
    assert code == 0
    agent.wait(timeout=15)
    assert agent.returncode != 0 and not alive(pid)


# --- refusals (attacks) ------------------------------------------------------------------------------------

def test_a_spawn_without_the_gangs_key_is_refused_and_runs_nothing(gang, tmp_path):
    marker = tmp_path / "pwned"
    with pytest.raises(control.WorkerRefused, match="does not hold this gang's key"):
        control.connect_spawn(gang.launcher, "127.0.0.1", gang.port, b"guessed" * 5, f"touch {marker}")
    # What anyone can read from a pod spec is no key either: the namespace, the job, the launcher's address.
    with pytest.raises(control.WorkerRefused, match="does not hold this gang's key"):
        control.connect_spawn(gang.launcher, "127.0.0.1", gang.port, b"team-a/pi", f"touch {marker}")
    assert gang.run("true").returncode == 0  # the gang's own agent still gets through
    time.sleep(0.5)
    assert not marker.exists()
    _, output = gang.finish()
    assert "refused a connection from 127.0.0.1: the launcher does not hold this gang's key" in output


def test_a_worker_spawns_nothing_before_its_launcher_attached(tmp_path):
    early = Gang(attach=False)
    marker = tmp_path / "early"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                control.connect_spawn(early.launcher, "127.0.0.1", early.port, CREDENTIALS.key, f"touch {marker}")
            except control.WorkerRefused as e:
                assert "serves no launcher yet" in str(e)
                break
            except (ConnectionRefusedError, control.ControlError):  # not listening, or no key yet: "for now"
                assert time.monotonic() < deadline
                time.sleep(0.05)
                continue
            raise AssertionError("a spawn before the launcher attached was accepted")
        assert not marker.exists()
    finally:
        early.worker.kill()
        early.worker.communicate()
        early.doorway.__exit__(None, None, None)


def test_a_worker_without_a_key_spawns_nothing_for_anyone(tmp_path):
    """No notary named: an empty key is one anybody holds, so a hello proven with it is refused (the worker says
    it has no key and keeps asking), and a launcher without a key does not even ask."""
    keyless = Gang(with_key=False, attach=False)
    marker = tmp_path / "keyless"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                channel = control.open_channel("127.0.0.1", keyless.port, 5)
                break
            except ConnectionRefusedError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        theirs = control.worker_opening(channel)
        channel.send(control.spawn_hello(keyless.launcher, b"", theirs, control.challenge(), f"touch {marker}"))
        answer = channel.receive(5)
        channel.close()
        assert answer is not None and answer.get("ok") is False and "no gang key yet" in answer["error"]
        with pytest.raises(control.WorkerRefused, match="this launcher has no gang key"):
            control.connect_spawn(keyless.launcher, "127.0.0.1", keyless.port, b"", f"touch {marker}")
        done = keyless.run("touch", str(marker))
        assert done.returncode == 255 and b"the launcher has no gang key" in done.stderr
        assert not marker.exists()
    finally:
        keyless.worker.kill()
        output, _ = keyless.worker.communicate()
        keyless.doorway.__exit__(None, None, None)
    assert "no gang key: TRAINHOOK_NOTARY is not set" in output


def test_the_doorway_is_closed_to_other_users_by_its_directory_and_by_their_uid(gang):
    probe = ("import socket, sys\ns = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect(sys.argv[1])\n"
             "except OSError as e:\n    print('refused:', e.strerror); sys.exit(0)\n"
             "try:\n    s.sendall(b'{\"host\": \"127.0.0.1\", \"command\": \"true\"}\\n')\n"
             "    print('answer:', s.recv(4096).decode() or 'closed')\n"
             "except (BrokenPipeError, ConnectionResetError):\n    print('answer: closed')\n")
    as_nobody = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "/usr/bin/python3", "-c",
                 probe, str(gang.doorway.path)]
    assert oct(gang.doorway.path.parent.stat().st_mode & 0o777) == "0o700"
    first = subprocess.run(as_nobody, capture_output=True, text=True, timeout=30)
    assert first.stdout.strip() == "refused: Permission denied", first.stdout + first.stderr
    # Were the directory opened up, the doorway still serves only its own uid (SO_PEERCRED).
    gang.doorway.path.parent.chmod(0o755)
    gang.doorway.path.chmod(0o777)
    second = subprocess.run(as_nobody, capture_output=True, text=True, timeout=30)
    assert second.stdout.strip() == "answer: closed", second.stdout + second.stderr
    assert gang.said == [f"doorway: refused a caller of uid 65534 (only uid {os.getuid()}, mpirun's, is served)"]


def test_the_doorway_runs_nothing_on_a_host_outside_the_gang(gang):
    done = gang.run("true", host="evil.example")
    assert done.returncode == 255
    assert b"'evil.example' is not a worker of gang team-a/pi (workers: 127.0.0.1)" in done.stderr


def test_an_agent_outside_a_launcher_says_where_it_looked_and_exits_255(tmp_path):
    argv = [sys.executable, "-m", "trainhook.launcher.cli", "kubexec", "--transport", "gang", "--doorway",
            str(tmp_path / "none" / "doorway.sock"), "w-1.pi", "true"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert done.returncode == 255
    assert f"no doorway at {tmp_path}/none/doorway.sock: the gang transport's agent runs under" in done.stderr
