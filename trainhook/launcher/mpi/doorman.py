"""The MPI worker's listener: who may talk to `mpi-worker`, and what an unauthenticated crowd can cost it.

Every connection to the gang's port gets a handshake (mpi_control's HMAC challenge both ways) in its own thread,
so one that never says hello holds up nobody. Two kinds pass: the launcher's control connection (the first one
claims the worker; later ones are refused) and, once a launcher is attached, spawn connections of the `gang`
transport (mpi_spawn runs their command). What a hostile client can do is bounded (issue 23, item 2):

- **a whole-handshake deadline** (HANDSHAKE_DEADLINE from accept, not per read): a client that sends one byte
  every few seconds is closed when the deadline passes, whatever it has sent;
- **a cap on pending connections** (MAX_PENDING not yet authenticated): over the cap the oldest pending one is
  closed, so a flood costs at most MAX_PENDING threads and sockets, and a real launcher, whose handshake takes
  milliseconds, still gets through a continuous flood;
- **refusals logged at a bounded rate** (LOG_BURST lines per LOG_WINDOW, then one line counting the rest);
- **an accept loop that never dies**: a thread that cannot start refuses that connection only, and accept()
  errors (EMFILE: out of file descriptors) back off briefly and go on.

A worker without a key (the notary has not answered it yet, or none is named) accepts no launcher and spawns
nothing: an empty key is one anybody holds (issue 31). It says so to each launcher, which asks again, while
worker.KeyFromNotary keeps asking the notary; the first launcher after the key arrives is served.
"""

from __future__ import annotations

import errno
import queue
import socket
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Callable, Mapping

from trainhook.launcher.mpi import kubexec
from trainhook.launcher.mpi import control
from trainhook.launcher.pod_view import GangView
from trainhook.launcher.mpi.spawn import Children, run_spawn

HANDSHAKE_DEADLINE = control.HELLO_TIMEOUT
MAX_PENDING = 64
THREAD_SLACK, EVICTION_WAIT = 2, 1.0  # handshake threads beyond the cap while dropped ones end; how long to wait
LOG_BURST, LOG_WINDOW = 5, 10.0
ACCEPT_BACKOFF = 0.05


class Throttled:
    """say() at most LOG_BURST times per LOG_WINDOW; what is held back is counted in one line later."""

    def __init__(self, say: Callable[[str], None], burst: int = LOG_BURST, window: float = LOG_WINDOW):
        self.say, self.burst, self.window = say, burst, window
        self.lock = threading.Lock()
        self.started, self.said, self.held = time.monotonic(), 0, 0

    def __call__(self, message: str) -> None:
        with self.lock:
            self._roll()
            if self.said < self.burst:
                self.said += 1
                self.say(message)
            else:
                self.held += 1

    def flush(self) -> None:
        with self.lock:
            self._roll()

    def _roll(self) -> None:
        if time.monotonic() - self.started < self.window:
            return
        if self.held:
            self.say(f"{self.held} more refused or dropped connection(s) not logged in the last {self.window:g}s")
        self.started, self.said, self.held = time.monotonic(), 0, 0


class Doorman:
    """Authenticates incoming connections and hands the main loop the first launcher; serves spawns after it."""

    def __init__(self, gang: GangView, slots: int, token: bytes | Callable[[], bytes], say: Callable[[str], None],
                 children: Children | None = None, env: Mapping[str, str] | None = None):
        """`token`: the gang's key, or what returns it once the notary has answered (worker.KeyFromNotary.get; b"" until
        then)."""
        self.gang, self.slots, self.say = gang, slots, say
        self.key_of: Callable[[], bytes] = token if callable(token) else (lambda: token)
        self.children = children or Children()
        self.env = env if env is not None else {}
        self.lock = threading.Lock()
        self.claimed = False
        self.pending: OrderedDict[socket.socket, str] = OrderedDict()
        self.threads = 0  # threads still in their handshake: pending ones, and dropped ones not yet gone
        self.thread_ended = threading.Condition(self.lock)
        self.ready: queue.Queue[control.LineSocket] = queue.Queue()
        self.refusals = Throttled(say)

    def admit(self, server: socket.socket) -> None:
        """Accept one connection and start its handshake; never raises."""
        try:
            sock, address = server.accept()
        except OSError as e:
            if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                self.refusals(f"cannot accept a connection: {e.strerror or e}")
                time.sleep(ACCEPT_BACKOFF)
            return
        host = str(address[0]) if address else "?"
        host = host[len("::ffff:"):] if host.startswith("::ffff:") and "." in host else host  # IPv4 on a v6 socket
        with self.lock:
            if len(self.pending) >= MAX_PENDING:
                oldest, oldest_host = self.pending.popitem(last=False)
                self._hang_up(oldest)
                self.refusals(f"dropped a connection from {oldest_host}: {MAX_PENDING} connections were waiting "
                              "to authenticate (the oldest is dropped)")
            # A dropped connection's thread ends within milliseconds; under a flood, wait for it (bounded) so that
            # the threads never outnumber the cap, however busy the CPU is.
            self.thread_ended.wait_for(lambda: self.threads < MAX_PENDING + THREAD_SLACK, EVICTION_WAIT)
            self.pending[sock] = host
            self.threads += 1
        try:
            threading.Thread(target=self.handshake, args=(sock, host), daemon=True).start()
        except RuntimeError as e:
            with self.lock:
                self.pending.pop(sock, None)
                self.threads -= 1
            sock.close()
            self.refusals(f"refused a connection from {host}: cannot start a thread for it ({e})")

    def attached(self) -> control.LineSocket | None:
        self.refusals.flush()
        try:
            return self.ready.get_nowait()
        except queue.Empty:
            return None

    def pending_count(self) -> int:
        with self.lock:
            return len(self.pending)

    @staticmethod
    def _hang_up(sock: socket.socket) -> None:
        """Wake the handshake thread blocked on `sock` (it closes the socket itself)."""
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _authenticated(self, sock: socket.socket) -> bool:
        """Leave the pending set; False when this connection was dropped meanwhile (over the cap)."""
        with self.lock:
            return self.pending.pop(sock, None) is not None

    def _handshake_over(self, counted: bool) -> None:
        with self.lock:
            self.threads -= counted
            self.thread_ended.notify_all()

    def handshake(self, sock: socket.socket, host: str) -> None:
        deadline = time.monotonic() + HANDSHAKE_DEADLINE
        counted = True
        channel = control.LineSocket(sock)
        try:
            control.set_keepalive(sock)
            sock.settimeout(HANDSHAKE_DEADLINE)  # bounds every send; receive() bounds itself by `deadline`
            mine = control.challenge()
            channel.send({"protocol": control.PROTOCOL, "challenge": mine})
            message = channel.receive(max(0.0, deadline - time.monotonic()))
            if message is None:
                raise control.ControlError("it closed the connection" if channel.closed else
                                           f"no hello within the {HANDSHAKE_DEADLINE:g}s handshake deadline")
            key = self.key_of()
            refusal = control.authenticate(self.gang, key, mine, message)
            if not refusal and not self._authenticated(sock):
                raise control.ControlError("dropped while waiting (too many pending connections)")
            if not refusal:
                self._handshake_over(counted)  # a spawn's thread serves it for the command's lifetime
                counted = False
            if refusal:
                self._refuse(channel, host, refusal, retry=refusal == control.NO_KEY)
            elif "spawn" in message:
                self._spawn(channel, host, message, deadline, key, mine)
            else:
                self._launcher(channel, host, message, key, mine)
        except (OSError, control.ControlError) as e:
            channel.close()
            self.refusals(f"dropped a connection from {host}: {e}")
        finally:
            with self.lock:
                self.pending.pop(sock, None)
            self._handshake_over(counted)

    def _refuse(self, channel: control.LineSocket, host: str, refusal: str, retry: bool = False) -> None:
        try:
            channel.send({"ok": False, "error": refusal, **({"retry": True} if retry else {})})
        except OSError:
            pass
        channel.close()
        self.refusals(f"refused a connection from {host}: {refusal}")

    @staticmethod
    def _answer_ok(channel: control.LineSocket, key: bytes, message: dict, **more: object) -> None:
        channel.send(control.signed(key, "worker", str(message.get("challenge", "")), {"ok": True, **more}))

    def _launcher(self, channel: control.LineSocket, host: str, message: dict, key: bytes, mine: str) -> None:
        refusal, setup = control.judge_hello(self.gang, key, mine, message)
        if not refusal:
            with self.lock:
                refusal = "this worker already serves a launcher" if self.claimed else ""
                self.claimed = self.claimed or not refusal
            if not refusal and setup is not None:
                refusal = install_worker_agent(setup)
                if refusal:
                    with self.lock:
                        self.claimed = False
        if refusal:
            self._refuse(channel, host, refusal)
            return
        channel.sock.settimeout(None)
        self._answer_ok(channel, key, message, slots=self.slots)
        channel.secure(control.session_key(key, mine, str(message["challenge"])), control.TO_LAUNCHER,
                       control.TO_WORKER)
        self.say(f"launcher connected from {host}")
        self.ready.put(channel)

    def _spawn(self, channel: control.LineSocket, host: str, message: dict, deadline: float, key: bytes,
               mine: str) -> None:
        """The command is the one the launcher signed (authenticate checked the hello's proof over it); the
        frames that follow are signed with this connection's session key."""
        command = message.get("spawn")
        with self.lock:
            claimed = self.claimed
        if not isinstance(command, str) or not command.strip():
            self._refuse(channel, host, "a spawn request needs a command")
        elif not claimed:
            self._refuse(channel, host, "this worker serves no launcher yet (its control connection comes first)")
        else:
            self._answer_ok(channel, key, message)
            session = control.session_key(key, mine, str(message["challenge"]))
            run_spawn(channel, command, self.children, self.env, deadline, self.say, session)


def install_worker_agent(setup: control.Setup) -> str:
    """Install the launcher's rsh agent here too ('' when done, else why not): OpenMPI's orted checks that the
    plm_rsh_agent it is given exists before it starts, on every node."""
    if not setup.agent:
        return ""
    try:
        kubexec.install_agent(Path(setup.agent), setup.transport, Path(setup.run_dir) if setup.run_dir else None)
    except OSError as e:
        return (f"cannot write the rsh agent {setup.agent} in this worker: {e.strerror or e} (trainhook's webhook "
                "mounts an emptyDir at /etc/mpi in MPI pods; is the pod labeled and admitted?)")
    return ""
