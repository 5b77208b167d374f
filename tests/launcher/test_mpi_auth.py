"""Issue 31 item 5: the MPI channel against someone on its path, tried against the real processes on loopback.

The worker is `trainhook-launch mpi-worker` as a process with its key from the real webhook's notary (as a pod gets
it); the launcher's side is its real doorway (gang_transport.Doorway) and the real rsh agent (`trainhook-launch
kubexec --transport gang`) as a process, called as mpirun calls it. Between the doorway and the worker sits a
`Relay`: what an on-path attacker is, or a pod that answers for the worker's name and passes on what it likes. The
gang's key is never the attacker's; everything else on the wire is.

Each attack succeeded before the channel was signed end to end (the command inside the hello's proof, every frame
after it signed with the connection's session key and numbered per direction), and must fail now:
- the relay swaps the command in a spawn request: the worker ran the relay's command;
- the relay injects a frame (a forged EXIT to the agent) or replays one (the agent's STDIN twice to the worker);
- a worker whose notary did not answer held an empty key and took any launcher that computed the HMAC under it.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

import pytest

from gang_notary import MpiGangCredentials
from trainhook.launcher.mpi import control
from trainhook.launcher.mpi import gang_transport
from trainhook.launcher.pod_view import Peer, parse_gang
from webhook_process import free_port

SHAPE = {"TRAINHOOK_FRAMEWORK": "mpi", "TRAINHOOK_JOB_NAME": "pi", "TRAINHOOK_NAMESPACE": "team-a",
         "TRAINHOOK_REPLICAS": "launcher=1,worker=1", "TRAINHOOK_HOSTS": "launcher=pi-launcher,worker=pi-worker",
         "TRAINHOOK_SUBDOMAIN": "pi", "TRAINHOOK_WORKLOAD": "Job/pi-worker", "TRAINHOOK_RESTART_POLICY": "Never"}
CREDENTIALS = MpiGangCredentials()
mpi_notary = CREDENTIALS.fixture()
HEADER = struct.Struct("!BI")
TAG = getattr(gang_transport, "TAG", 0)  # bytes after each frame's data (0: frames were not signed)


def gang_env(role: str, port: int, **more: str) -> dict[str, str]:
    return {"PATH": os.environ["PATH"], **SHAPE, "TRAINHOOK_ROLE": role, "TRAINHOOK_INDEX": "0",
            "TRAINHOOK_RANK": "0" if role == "launcher" else "1", "TRAINHOOK_PORT": str(port),
            "TRAINHOOK_WAIT_TIMEOUT": "60", "TRAINHOOK_MPI_SLOTS": "1", **more}


def read_line(sock: socket.socket, buffer: bytearray) -> bytes:
    while b"\n" not in buffer:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        buffer += chunk
    end = buffer.index(b"\n") + 1
    line = bytes(buffer[:end])
    del buffer[:end]
    return line


class Relay:
    """A TCP relay to the worker's port that sees every byte: the launcher's hello may be rewritten
    (`rewrite_hello`), bytes may be slipped to the agent right after the worker's answer (`inject_to_agent`), and
    the agent's frames may be passed on twice (`replay`: which channels)."""

    def __init__(self, worker_port: int, rewrite_hello: Callable[[dict], dict] | None = None,
                 inject_to_agent: bytes = b"", replay: tuple[int, ...] = ()):
        self.worker_port, self.rewrite_hello = worker_port, rewrite_hello
        self.inject_to_agent, self.replay = inject_to_agent, replay
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                launcher, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(launcher,), daemon=True).start()

    def _relay(self, launcher: socket.socket) -> None:
        worker = socket.create_connection(("127.0.0.1", self.worker_port))
        from_launcher, from_worker = bytearray(), bytearray()
        try:
            launcher.sendall(read_line(worker, from_worker))  # the worker's challenge
            hello = json.loads(read_line(launcher, from_launcher))
            if self.rewrite_hello is not None:
                hello = self.rewrite_hello(hello)
            worker.sendall(json.dumps(hello).encode() + b"\n")
            launcher.sendall(read_line(worker, from_worker))  # the worker's answer
            threading.Thread(target=self._pipe, args=(worker, launcher, bytes(from_worker), self.inject_to_agent),
                             daemon=True).start()
            self._agent_frames(launcher, worker, from_launcher)
        except OSError:
            pass
        finally:
            for sock in (launcher, worker):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket, first: bytes, inject: bytes = b"") -> None:
        """`first`, then what `source` sends; `inject` goes just before the first chunk that `source` sends (the
        agent holds the connection by then: the doorway reads nothing past the worker's answer)."""
        try:
            sink.sendall(first)
            while True:
                chunk = source.recv(65536)
                if not chunk:
                    sink.shutdown(socket.SHUT_WR)
                    return
                sink.sendall(inject + chunk)
                inject = b""
        except OSError:  # a reset: pass it on, or the other end waits for ever
            for sock in (sink, source):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _agent_frames(self, agent: socket.socket, worker: socket.socket, buffer: bytearray) -> None:
        while True:
            while len(buffer) < HEADER.size:
                chunk = agent.recv(65536)
                if not chunk:
                    worker.shutdown(socket.SHUT_WR)
                    return
                buffer += chunk
            channel, length = HEADER.unpack_from(buffer)
            while len(buffer) < HEADER.size + length + TAG:
                chunk = agent.recv(65536)
                if not chunk:
                    return
                buffer += chunk
            frame = bytes(buffer[:HEADER.size + length + TAG])
            del buffer[:len(frame)]
            worker.sendall(frame * (2 if channel in self.replay else 1))

    def close(self) -> None:
        self.server.close()


class Gang:
    """One worker process attached to its launcher, and the launcher's doorway dialling the worker through
    `relay` (made with the worker's port)."""

    def __init__(self, make_relay: Callable[[int], Relay]):
        self.port = free_port()
        self.worker = subprocess.Popen([sys.executable, "-m", "trainhook.launcher.cli", "mpi-worker"],
                                       env={**gang_env("worker", self.port), **CREDENTIALS.worker_env},
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        launcher = parse_gang(gang_env("launcher", self.port))
        self.launcher = launcher.replace(peers=(launcher.peers[0], Peer("worker", 0, 1, "127.0.0.1")))
        self.link = attach(self.launcher, self.port, CREDENTIALS.key)
        self.relay = make_relay(self.port)
        root = Path(tempfile.mkdtemp(prefix="th-auth-"))
        self.doorway = gang_transport.Doorway(self.launcher, CREDENTIALS.key, self.relay.port,
                                              gang_transport.doorway_path(root / "kubexec.sh"), say=lambda _: None)
        self.doorway.__enter__()

    def run(self, *words: str, stdin: bytes = b"") -> subprocess.CompletedProcess:
        argv = [sys.executable, "-m", "trainhook.launcher.cli", "kubexec", "--transport", "gang", "--doorway",
                str(self.doorway.path), "127.0.0.1", *words]
        return subprocess.run(argv, input=stdin, capture_output=True, timeout=60)

    def finish(self) -> str:
        self.doorway.__exit__(None, None, None)
        self.relay.close()
        self.link.tell_exit(0, "done")
        try:
            output, _ = self.worker.communicate(timeout=15)
        finally:
            if self.worker.poll() is None:
                self.worker.kill()
                output, _ = self.worker.communicate()
        return output


def attach(launcher, port: int, key: bytes, timeout: float = 30) -> control.WorkerLink:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return control.connect_worker(launcher, Peer("worker", 0, 1, "127.0.0.1"), port, key,
                                          control.Setup("gang", ""))
        except (ConnectionRefusedError, control.ControlError) as e:
            if isinstance(e, control.WorkerRefused) or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_a_relay_that_swaps_the_command_gets_nothing_run(tmp_path):
    marker = tmp_path / "swapped"
    gang = Gang(lambda port: Relay(port, rewrite_hello=lambda hello: {**hello, "spawn": f"touch {marker}"}))
    try:
        done = gang.run("echo", "the launcher's own command")
        time.sleep(0.5)
        assert not marker.exists(), "the worker ran the relay's command"
        assert done.returncode == 255 and b"the launcher's own command" not in done.stdout
        assert b"changed on the way" in done.stderr, done.stderr
    finally:
        output = gang.finish()
    assert "its hello was changed on the way" in output


def test_a_frame_injected_towards_the_agent_is_refused(tmp_path):
    # A forged EXIT 0 slipped in before the worker's own frames: the command really exits 7.
    forged = HEADER.pack(gang_transport.EXIT, 1) + b"0"
    gang = Gang(lambda port: Relay(port, inject_to_agent=forged))
    try:
        done = gang.run("echo", "real;", "exit", "7")
        assert done.returncode != 0, "the agent took the relay's exit status"
        assert done.returncode == 255 and b"not signed with this connection's key" in done.stderr, done.stderr
    finally:
        gang.finish()


def test_a_frame_replayed_towards_the_worker_is_refused_and_the_command_stopped(tmp_path):
    out = tmp_path / "out"
    gang = Gang(lambda port: Relay(port, replay=(gang_transport.STDIN,)))
    try:
        done = gang.run("cat", ">", str(out), "&&", "sleep", "1", stdin=b"pay 100\n")
        time.sleep(0.5)
        assert out.read_bytes() != b"pay 100\npay 100\n", "the worker fed the replayed frame to the command"
        assert done.returncode == 255, done
    finally:
        output = gang.finish()
    assert "not signed with this connection's key" in output or "went away" in output, output


def test_a_worker_without_a_key_takes_no_launcher_and_gets_its_key_once_the_notary_answers(mpi_notary):
    """The notary is unreachable when the worker starts (its URL names a port nothing listens on yet): it holds no
    key. An attacker computes the hello's HMAC under the empty key; the worker must refuse it (before: it attached
    that launcher, which could then end the worker with any code), keep asking, and take the real launcher once
    the notary answers through a relay that opens later."""
    port, notary_port = free_port(), free_port()
    url = CREDENTIALS.worker_env["TRAINHOOK_NOTARY"]
    env = {**CREDENTIALS.worker_env, "TRAINHOOK_NOTARY": f"https://localhost:{notary_port}"}
    # Its wait timeout bounds both how long it asked the notary before (then it went on with b"") and how long
    # it waits for a launcher.
    worker = subprocess.Popen([sys.executable, "-m", "trainhook.launcher.cli", "mpi-worker"],
                              env={**gang_env("worker", port, TRAINHOOK_WAIT_TIMEOUT="8"), **env},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    launcher = parse_gang(gang_env("launcher", port))
    relay = None
    try:
        for _ in range(3):
            channel = control.open_channel("127.0.0.1", port, 5) if wait_listening(port) else None
            assert channel is not None
            theirs = control.worker_opening(channel)
            channel.send(control.control_hello(launcher, b"", theirs, control.challenge(),
                                               control.Setup("gang", "")))
            answer = channel.receive(5)
            channel.close()
            assert answer is not None and not answer.get("ok"), f"an empty-key launcher was attached: {answer}"
            assert "no gang key yet" in answer["error"] and answer.get("retry") is True
        with pytest.raises(control.ControlError, match="refused for now: this worker has no gang key yet"):
            control.connect_worker(launcher, Peer("worker", 0, 1, "127.0.0.1"), port, CREDENTIALS.key,
                                   control.Setup("gang", ""))
        assert worker.poll() is None
        relay = socket_relay(notary_port, int(url.rsplit(":", 1)[1]))
        link = attach(launcher, port, CREDENTIALS.key, timeout=60)  # the worker asked again, and got its key
        link.tell_exit(0, "done")
        output, _ = worker.communicate(timeout=15)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()
        if relay is not None:
            relay.close()
    assert worker.returncode == 0, output
    assert "waiting for the gang's key from the notary" in output and "launcher connected from 127.0.0.1" in output


def wait_listening(port: int, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 1).close()
            return True
        except OSError:
            time.sleep(0.05)
    return False


def socket_relay(listen_port: int, target_port: int) -> socket.socket:
    """Bytes only from `listen_port` to `target_port` (the notary's TLS stays end to end)."""
    server = socket.create_server(("127.0.0.1", listen_port))

    def serve() -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", target_port))
            threading.Thread(target=Relay._pipe, args=(client, upstream, b""), daemon=True).start()
            threading.Thread(target=Relay._pipe, args=(upstream, client, b""), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return server


def test_a_hello_whose_proof_is_not_ascii_is_refused_and_the_worker_goes_on(tmp_path):
    marker = tmp_path / "unicode"
    gang = Gang(lambda port: Relay(port, rewrite_hello=lambda hello: {**hello, "proof": "\u00e9" * 64}))
    try:
        done = gang.run("touch", str(marker))
        assert done.returncode == 255 and not marker.exists()
        assert gang.worker.poll() is None
    finally:
        output = gang.finish()
    assert gang.worker.returncode == 0 and "Traceback" not in output, output
