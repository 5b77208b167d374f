"""The `gang` transport: mpirun's rsh agent starts its daemons through the workers' own `mpi-worker`.

No Kubernetes API call, no `pods/exec` grant, no sshd in the image. Three processes take part:

    mpirun -> agent (`trainhook-launch kubexec --transport gang HOST WORDS...`, in the launcher's pod)
           -> the launcher's doorway (a unix socket served by `trainhook-launch mpirun`, the only holder of the key)
           -> HOST's `mpi-worker` (the gang's control port; mpi_spawn runs `/bin/sh -c "WORDS"` there)

The agent never holds the gang's key. It asks the doorway; the launcher dials the worker, authenticates both
ways with the key (mpi_control.connect_spawn, the control channel's HMAC handshake, whose proof covers the
command), and hands the agent the connected, already-authenticated TCP socket as a file descriptor (SCM_RIGHTS)
with that connection's session key (mpi_control.session_key: derived from both ends' fresh challenges, it opens
nothing but this one connection). The agent then speaks signed frames on it directly, so its I/O costs the
launcher nothing. For the launcher's own host (Hydra starts a proxy there through
the agent too) the doorway says so and the agent runs the command right here, as ssh to oneself would.

Why a doorway rather than giving the agent the key:
- mpirun's children are the user's processes too: anything put in the agent's environment or on its command
  line is readable there (and by /proc, ps, core dumps, crash reports). The key must stay in the launcher's
  memory (docs/operate/security.md), so the agent is handed a *capability* (one connection to one worker of this gang,
  for one command) instead of a secret that would outlive the pod.
- an inherited pipe or fd does not reach the agent: OpenMPI's rsh launcher closes every fd above 2 in the child
  before it execs the agent.
- the socket is in a directory only the launcher's user may enter (0700), and the doorway also checks the
  caller's uid (SO_PEERCRED): the only callers it serves are processes of the user mpirun itself runs as, who can
  start daemons on the gang's workers through mpirun anyway. No other container of the pod mounts /etc/mpi.

Frames (both directions, after the handshake): a header `!BI` (channel, length), `length` bytes (at most
MAX_FRAME), then a 32-byte tag, HMAC-SHA256(session key, direction | frame number | header | bytes), the frame
number counting from 0 per direction (FrameSigner). So a frame injected, replayed, dropped, reordered or reflected
back by anyone on the path (issue 31) is refused and the connection closed, which ends the command.
Agent -> worker: START once (spawn now), STDIN data, STDIN_EOF. Worker -> agent: STDOUT, STDERR data, then EXIT
with the code as ASCII digits. The connection closing is the kill: when the agent dies (any
signal, SIGKILL included) the worker stops the command's process group; when the command ends, the agent exits
with its code (128+N for a signal N). Buffers are bounded: at most one frame in flight per direction in our own
memory, the rest is TCP's and the pipes' backpressure.
"""

from __future__ import annotations

import array
import hashlib
import hmac
import json
import os
import socket
import stat
import struct
import sys
import threading
from pathlib import Path

from trainhook.launcher.mpi import control
from trainhook.launcher.pod_view import GangView

HEADER = struct.Struct("!BI")
MAX_FRAME = 65536
START, STDIN, STDIN_EOF, STDOUT, STDERR, EXIT = 1, 2, 3, 4, 5, 6
EXIT_AGENT_FAILED = 255  # ssh's code for "could not run the command at all"
REMOTE_SHELL = "/bin/sh"
DOORWAY_DIR = ".trainhook-doorway"  # beside the agent script, mode 0700
DOORWAY_SOCKET = "doorway.sock"
MAX_CONCURRENT_DIALS = 64  # spawn handshakes the doorway runs at once; more callers queue in the backlog
DOORWAY_WAIT = 3 * control.HELLO_TIMEOUT  # how long an agent waits for the doorway's answer


class FrameError(Exception):
    """The peer sent something that is not a frame of this protocol."""


def doorway_path(agent_path: Path) -> Path:
    return agent_path.parent / DOORWAY_DIR / DOORWAY_SOCKET


TAG = 32  # HMAC-SHA256 after every frame
TO_WORKER, TO_AGENT = b"a2w", b"w2a"


class FrameSigner:
    """One end of a spawn connection's signed frames: the session key, and the frame numbers both ways."""

    def __init__(self, session: bytes, outgoing: bytes, incoming: bytes):
        if not session:
            raise ValueError("a spawn connection without a session key")
        self.session, self.outgoing, self.incoming = session, outgoing, incoming
        self.sent = self.received = 0
        self.lock = threading.Lock()

    @classmethod
    def agent(cls, session: bytes) -> FrameSigner:
        return cls(session, TO_WORKER, TO_AGENT)

    @classmethod
    def worker(cls, session: bytes) -> FrameSigner:
        return cls(session, TO_AGENT, TO_WORKER)

    def tag(self, direction: bytes, number: int, header: bytes, data: bytes) -> bytes:
        mac = hmac.new(self.session, direction + struct.pack("!Q", number) + header, hashlib.sha256)
        mac.update(data)
        return mac.digest()


def send_frame(sock: socket.socket, signer: FrameSigner, channel: int, data: bytes = b"") -> None:
    for start in range(0, max(len(data), 1), MAX_FRAME):
        chunk = data[start:start + MAX_FRAME]
        header = HEADER.pack(channel, len(chunk))
        with signer.lock:  # numbers and the bytes on the wire in the same order
            tag = signer.tag(signer.outgoing, signer.sent, header, chunk)
            signer.sent += 1
            sock.sendall(header + chunk + tag)


class FrameReader:
    """Reads signed frames off a blocking socket; `buffer` holds bytes already read past the handshake."""

    def __init__(self, sock: socket.socket, signer: FrameSigner, buffer: bytes = b""):
        self.sock, self.signer, self.buffer = sock, signer, buffer

    def _fill(self, size: int) -> bool:
        while len(self.buffer) < size:
            chunk = self.sock.recv(MAX_FRAME + HEADER.size + TAG)
            if not chunk:
                return False
            self.buffer += chunk
        return True

    def read(self) -> tuple[int, bytes] | None:
        """The next (channel, data), None when the peer closed; FrameError for garbage or a frame this
        connection's peer did not send in this place (injected, replayed, reordered); OSError passes."""
        if not self._fill(HEADER.size):
            return None
        channel, length = HEADER.unpack_from(self.buffer)
        if length > MAX_FRAME or channel not in (START, STDIN, STDIN_EOF, STDOUT, STDERR, EXIT):
            raise FrameError(f"bad frame header (channel {channel}, length {length})")
        end = HEADER.size + length
        if not self._fill(end + TAG):
            return None
        header, data, tag = self.buffer[:HEADER.size], self.buffer[HEADER.size:end], self.buffer[end:end + TAG]
        self.buffer = self.buffer[end + TAG:]
        signer = self.signer
        if not hmac.compare_digest(tag, signer.tag(signer.incoming, signer.received, header, data)):
            raise FrameError(f"frame {signer.received} is not signed with this connection's key (injected, "
                             "replayed or reordered on the way)")
        signer.received += 1
        return channel, data


# --- the launcher's side: the doorway ------------------------------------------------------------------------

class Doorway:
    """The unix socket the launcher serves its agents on, for as long as mpirun runs (`with Doorway(...)`)."""

    def __init__(self, gang: GangView, key: bytes, port: int, path: Path, say=print):
        self.gang, self.key, self.port, self.path, self.say = gang, key, port, path, say
        self.slots = threading.BoundedSemaphore(MAX_CONCURRENT_DIALS)
        self.server: socket.socket | None = None
        self.thread = threading.Thread(target=self._accept_loop, name="trainhook-doorway", daemon=True)

    def __enter__(self) -> Doorway:
        directory = self.path.parent
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(directory, 0o700)  # an existing directory too: the mode is the access control
        if self.path.exists() or self.path.is_symlink():
            self.path.unlink()
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(self.path))
        self.server.listen(128)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        server, self.server = self.server, None
        if server is not None:
            try:
                server.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            server.close()
        try:
            self.path.unlink()
        except OSError:
            pass

    def _accept_loop(self) -> None:
        while self.server is not None:
            try:
                caller, _ = self.server.accept()
            except OSError:
                if self.server is None:
                    return
                threading.Event().wait(0.1)  # EMFILE and friends: the loop goes on
                continue
            self.slots.acquire()
            try:
                threading.Thread(target=self._serve, args=(caller,), daemon=True).start()
            except RuntimeError:
                self.slots.release()
                self._answer(caller, {"ok": False, "error": "the launcher cannot start a thread"})
                caller.close()

    def _serve(self, caller: socket.socket) -> None:
        try:
            caller.settimeout(DOORWAY_WAIT)
            self._handle(caller)
        except OSError:
            pass
        finally:
            caller.close()
            self.slots.release()

    def _handle(self, caller: socket.socket) -> None:
        creds = caller.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _, uid, _ = struct.unpack("3i", creds)
        if uid != os.getuid():
            self.say(f"doorway: refused a caller of uid {uid} (only uid {os.getuid()}, mpirun's, is served)")
            return
        request = control.LineSocket(caller).receive(control.HELLO_TIMEOUT)
        if not self.key:
            self._answer(caller, {"ok": False, "error": "the launcher has no gang key (no notary answered it): "
                                  "the workers spawn nothing without one"})
            return
        host, command = str((request or {}).get("host", "")), (request or {}).get("command")
        if not isinstance(command, str) or not command:
            self._answer(caller, {"ok": False, "error": "no command in the request"})
            return
        if self.is_own(host):  # Hydra starts a proxy on its own host through the agent too
            self._answer(caller, {"ok": True, "local": True})
            return
        address = self.worker_address(host)
        if address is None:
            self._answer(caller, {"ok": False, "error": f"{host!r} is not a worker of gang "
                                  f"{self.gang.namespace}/{self.gang.job_name} (workers: "
                                  f"{', '.join(p.address for p in self.gang.peers if p.rank != self.gang.rank)})"})
            return
        try:
            channel = control.connect_spawn(self.gang, address, self.port, self.key, command)
        except (OSError, control.ControlError) as e:
            self._answer(caller, {"ok": False, "error": f"cannot reach the mpi-worker of {address} on port "
                                  f"{self.port}: {e}"})
            return
        try:
            self._answer(caller, {"ok": True, "session": channel.session.hex()}, channel.sock.fileno())
        finally:
            channel.close()  # the agent holds its own copy now

    def is_own(self, host: str) -> bool:
        name = host.rpartition("@")[2]
        return bool(name) and name.split(".", 1)[0] == self.gang.address.split(".", 1)[0]

    def worker_address(self, host: str) -> str | None:
        """The member address `host` names (mpirun passes the hostfile's address; `user@` and a longer or
        shorter DNS name are accepted as long as the first label is a member's hostname), else None."""
        name = host.rpartition("@")[2]
        label = name.split(".", 1)[0]
        for peer in self.gang.peers:
            if peer.rank != self.gang.rank and name and (name == peer.address or label == peer.address.split(".")[0]):
                return peer.address
        return None

    @staticmethod
    def _answer(caller: socket.socket, message: dict, fd: int | None = None) -> None:
        data = json.dumps(message).encode() + b"\n"
        try:
            if fd is None:
                caller.sendall(data)
            else:
                caller.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]).tobytes())])
        except OSError:
            pass


# --- the agent's side ------------------------------------------------------------------------------------------

def gang_agent_failed(host: str, why: str) -> int:
    print(f"trainhook-launch kubexec {host}: {why}", file=sys.stderr, flush=True)
    return EXIT_AGENT_FAILED


def ask_doorway(path: Path, host: str, command: str) -> tuple[socket.socket, FrameSigner] | None:
    """The authenticated connection to `host`'s mpi-worker and the signer of its frames, from the launcher's
    doorway; None when `host` is the launcher's own pod (run the command here); RuntimeError says why there is
    none."""
    try:
        mode = os.lstat(path.parent).st_mode
    except OSError:
        raise RuntimeError(f"no doorway at {path}: the gang transport's agent runs under `trainhook-launch "
                           "mpirun` in the launcher's pod (set TRAINHOOK_MPI_TRANSPORT to pick another)") from None
    if not stat.S_ISDIR(mode) or stat.S_IMODE(mode) & 0o077:
        raise RuntimeError(f"{path.parent} is not a private directory (mode {stat.S_IMODE(mode):o}): refusing it")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(DOORWAY_WAIT)
        sock.connect(str(path))
        sock.sendall(json.dumps({"host": host, "command": command}).encode() + b"\n")
        fds = array.array("i")
        data, ancillary, _, _ = sock.recvmsg(control.LINE_LIMIT, socket.CMSG_SPACE(fds.itemsize))
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
        try:
            answer = json.loads(data.decode(errors="replace").split("\n", 1)[0] or "{}")
        except ValueError:
            answer = {}
        if answer.get("ok") and answer.get("local") and not fds:
            return None
        session = answer.get("session")
        if answer.get("ok") and len(fds) == 1 and isinstance(session, str) and len(session) == 2 * TAG:
            return socket.socket(fileno=fds[0]), FrameSigner.agent(bytes.fromhex(session))
        for fd in fds:
            os.close(fd)
        raise RuntimeError(answer.get("error") or "the launcher's doorway closed without an answer")
    except OSError as e:
        raise RuntimeError(f"the launcher's doorway {path}: {e.strerror or e}") from None
    finally:
        sock.close()


def pump_stdin(sock: socket.socket, signer: FrameSigner, stdin: int) -> None:
    """Our stdin to the remote command, then STDIN_EOF; one frame at a time (bounded)."""
    try:
        while True:
            data = os.read(stdin, MAX_FRAME)
            if not data:
                send_frame(sock, signer, STDIN_EOF)
                return
            send_frame(sock, signer, STDIN, data)
    except OSError:
        return


def write_all(fd: int, data: bytes) -> None:
    """Write every byte to `fd` (OSError when it cannot): the relayed command's output, here and in kubexec."""
    while data:
        data = data[os.write(fd, data):]


def run_agent(host: str, command: str, doorway: Path) -> int:
    """Run `command` in `host`'s pod through its mpi-worker; returns its exit code (255 when it could not run)."""
    try:
        link = ask_doorway(doorway, host, command)
    except RuntimeError as e:
        return gang_agent_failed(host, str(e))
    if link is None:  # the launcher's own pod: this container, as ssh to oneself would reach it
        try:
            os.execv(REMOTE_SHELL, [REMOTE_SHELL, "-c", command])
        except OSError as e:
            return gang_agent_failed(host, f"cannot run {REMOTE_SHELL}: {e.strerror or e}")
    sock, signer = link
    with sock:
        sock.settimeout(None)
        try:
            send_frame(sock, signer, START)
            try:
                os.fstat(0)
                threading.Thread(target=pump_stdin, args=(sock, signer, 0), daemon=True).start()
            except OSError:
                send_frame(sock, signer, STDIN_EOF)  # no stdin at all
            reader = FrameReader(sock, signer)
            while True:
                frame = reader.read()
                if frame is None:
                    return gang_agent_failed(host, "the connection to its mpi-worker closed without an exit status "
                                      "(the worker pod ended?)")
                channel, data = frame
                if channel == STDOUT:
                    write_all(1, data)
                elif channel == STDERR:
                    write_all(2, data)
                elif channel == EXIT:
                    text = data.decode(errors="replace")
                    return int(text) if text.isdigit() and int(text) <= 255 else EXIT_AGENT_FAILED
        except (OSError, FrameError) as e:
            return gang_agent_failed(host, f"the connection to its mpi-worker broke: {e}")
