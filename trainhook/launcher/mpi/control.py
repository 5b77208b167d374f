"""The control channel between an MPI gang's launcher and its workers: who is there, how the run ended, and
the gang transport's requests to start mpirun's daemons.

mpirun's daemons come and go through the rsh agent; what keeps a worker *pod* alive is this channel. Every
worker (`trainhook-launch mpi-worker`) listens on the gang's port; the launcher connects to each one before it
starts mpirun (that is its "every worker is reachable" check), keeps the connections open for the whole run, and
at the end sends each worker the outcome, which the worker exits with. So:

- a worker never outlives its launcher: the launcher's end closes the connection, and a worker whose
  connection closes without an outcome exits EXIT_LAUNCHER_LOST (also when no launcher came in time);
- a launcher notices at once when a worker pod goes away (its connection closes), stops mpirun and tells the
  others, instead of waiting for MPI's own timeouts.

TCP keepalive on both ends turns a vanished node (no FIN ever arrives) into a closed connection in ~25 s.

Both ends prove they hold the gang's key (`gang_token`): each sends a random challenge and answers the other's
with HMAC-SHA256(key, role + challenge), so nothing outside the gang can end a worker, install an agent in it,
have it spawn a command, or pose as a worker. The key never crosses the network.

Wire format: one JSON object per line.
  worker -> launcher  {"protocol": "trainhook-mpi/1", "challenge": C1}
  launcher -> worker  {"protocol": ..., "namespace": NS, "job": JOB, "launcher": ADDRESS, "proof": P(C1),
                       "challenge": C2, "transport": T, "agent": PATH, "run_dir": DIR}
  worker -> launcher  {"ok": true, "slots": N, "proof": P(C2)}  |  {"ok": false, "error": WHY}
  launcher -> worker  {"exit": CODE, "why": TEXT}
  worker -> launcher  {"bye": true}
The worker installs the rsh agent at PATH (under /etc/mpi only) before it answers.

A spawn (the `gang` transport, gang_transport): a second connection whose hello carries `"spawn": WORDS` instead of
the transport/agent fields; the worker answers {"ok": true, "proof": P(C2)} (only while it serves a launcher),
and from then on both ends speak gang_transport's binary frames on the same connection.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import select
import socket
import time
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Mapping

from trainhook.gang import keys
from trainhook.launcher.pod_view import GangView, Peer
from trainhook.launcher.wire import json_object, set_keepalive

PROTOCOL = "trainhook-mpi/1"
# Where workers listen: the gang's port (TRAINHOOK_PORT, the `trainhook.dev/port` annotation), 29498 by default
# (the gang wait uses 29499, torch 29500).
CONTROL_PORT = 29498
# A worker's exit code when its launcher hung up (or never came): 128 + SIGHUP, "the controlling process went
# away". 128 and above is retryable (contract section 7): a lost launcher is an eviction or a node loss.
EXIT_LAUNCHER_LOST = 129
# A hello carries a spawn's whole command line (OpenMPI's orted line with its -mca options runs to kilobytes).
LINE_LIMIT = 65536
HELLO_TIMEOUT = 10.0
TRANSPORTS = ("gang", "kubexec", "ssh", "local")
DEFAULT_TRANSPORT = "gang"
AGENT_DIR = PurePosixPath("/etc/mpi")  # the only place a worker writes the agent a launcher asks for


class ControlError(Exception):
    """A peer that is not (or no longer) a usable member of this gang's control channel."""


class WorkerRefused(ControlError):
    """The worker answered and said no: waiting longer will not change it."""


def control_port(gang: GangView) -> int:
    """The gang's port (TRAINHOOK_PORT), or CONTROL_PORT when it is 0."""
    return gang.port or CONTROL_PORT


def gang_token(env: Mapping[str, str]) -> bytes:
    """The gang's key. Every in-pod user of the key calls this one function (once per process: keep the result in
    memory, never in a file or a child's environment). It comes from the notary (notary_client.py), asked with this
    pod's identity token until the gang wait's timeout; b"" when the webhook named no notary or none answered
    (said on stderr: the peers then refuse this pod, naming the key)."""
    from trainhook.launcher import notary_client  # here, not at the top: this function is identity's one MPI caller
    try:
        notary = notary_client.from_env(env)
        if notary is None:
            notary_client.say(f"{keys.TH_NOTARY} is not set: this pod has no gang key (a webhook without a notary?)")
            return b""
        text = env.get(keys.TH_WAIT_TIMEOUT, "").strip()
        timeout = float(text) if text.replace(".", "", 1).isdigit() else 600.0
        return notary.gang_key(env.get(keys.TH_NAMESPACE, ""), env.get(keys.TH_JOB_NAME, ""), timeout)
    except notary_client.NotaryError as e:
        notary_client.say(f"no gang key: {e}")
        return b""


def proof(token: bytes, role: str, challenge: str) -> str:
    return hmac.new(token, f"{PROTOCOL} {role} {challenge}".encode(), hashlib.sha256).hexdigest()


def challenge() -> str:
    return secrets.token_hex(16)



class LineSocket:
    """A socket read one JSON line at a time (with its own buffer, so select() stays usable on `sock`)."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buffer = b""
        self.closed = False

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, message: dict) -> None:
        self.sock.sendall(json.dumps(message, separators=(",", ":")).encode() + b"\n")

    def pending(self) -> dict | None:
        """A complete message already buffered, if any."""
        if b"\n" not in self.buffer:
            return None
        line, self.buffer = self.buffer.split(b"\n", 1)
        message = json_object(line)
        if message is None:
            raise ControlError(f"not a trainhook control message: {line[:80]!r}")
        return message

    def feed(self) -> bool:
        """Read what the socket has (call when select() says readable); False once the peer closed."""
        try:
            chunk = self.sock.recv(LINE_LIMIT)
        except OSError:
            chunk = b""
        if not chunk:
            self.closed = True
            return False
        self.buffer += chunk
        if len(self.buffer) > LINE_LIMIT and b"\n" not in self.buffer:
            raise ControlError("control message too long")
        return True

    def receive(self, timeout: float) -> dict | None:
        """The next message, waiting at most `timeout`; None when the peer closed or nothing came."""
        deadline = time.monotonic() + timeout
        while True:
            message = self.pending()
            if message is not None or self.closed:
                return message
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            readable, _, _ = select.select([self.sock], [], [], left)
            if readable and not self.feed():
                return None

    def close(self) -> None:
        self.closed = True
        try:
            self.sock.close()
        except OSError:
            pass


@dataclass(frozen=True)
class Setup:
    """What a worker needs from its launcher before mpirun starts: the rsh agent to install (OpenMPI's orted
    refuses to start where its plm_rsh_agent path does not exist)."""

    transport: str
    agent: str
    run_dir: str = ""


def check_setup(setup: Setup) -> str:
    """'' when a worker may install this agent, else why not."""
    if setup.transport not in TRANSPORTS:
        return f"unknown transport {setup.transport!r}"
    if setup.run_dir and setup.transport != "local":
        return "a run directory is for the local transport only"
    agent = PurePosixPath(os.path.normpath(setup.agent)) if setup.agent else None
    if agent is not None and (not agent.is_absolute() or AGENT_DIR not in agent.parents):
        return f"the rsh agent must be in {AGENT_DIR}/ (not {setup.agent})"
    return ""


def control_hello(gang: GangView, token: bytes, worker_challenge: str, own_challenge: str, setup: Setup) -> dict:
    return {"protocol": PROTOCOL, "namespace": gang.namespace, "job": gang.job_name, "launcher": gang.address,
            "proof": proof(token, "launcher", worker_challenge), "challenge": own_challenge,
            "transport": setup.transport, "agent": setup.agent, "run_dir": setup.run_dir}


def spawn_hello(gang: GangView, token: bytes, worker_challenge: str, own_challenge: str, command: str) -> dict:
    return {"protocol": PROTOCOL, "namespace": gang.namespace, "job": gang.job_name, "launcher": gang.address,
            "proof": proof(token, "launcher", worker_challenge), "challenge": own_challenge, "spawn": command}


def authenticate(gang: GangView, token: bytes, sent_challenge: str, message: dict | None) -> str:
    """'' when `message` is a hello from a holder of this gang's key, else why it is refused."""
    if not message or message.get("protocol") != PROTOCOL:
        return "not a trainhook MPI launcher"
    if (message.get("namespace"), message.get("job")) != (gang.namespace, gang.job_name):
        return (f"launcher of gang {message.get('namespace')}/{message.get('job')}, not "
                f"{gang.namespace}/{gang.job_name}")
    if not hmac.compare_digest(str(message.get("proof", "")), proof(token, "launcher", sent_challenge)):
        return "the launcher does not hold this gang's key (were the pods admitted by different webhooks?)"
    return ""


def judge_hello(gang: GangView, token: bytes, sent_challenge: str, message: dict | None) -> tuple[str, Setup | None]:
    """('', setup) for a control hello from this gang's launcher, else (why it is refused, None)."""
    refusal = authenticate(gang, token, sent_challenge, message)
    if refusal or message is None:
        return refusal or "no hello", None
    setup = Setup(str(message.get("transport") or DEFAULT_TRANSPORT), str(message.get("agent") or ""),
                  str(message.get("run_dir") or ""))
    refusal = check_setup(setup)
    return refusal, (None if refusal else setup)


def open_channel(address: str, port: int, timeout: float) -> LineSocket:
    """A TCP connection to a worker's control port with keepalive on (OSError when it cannot be made)."""
    sock = socket.create_connection((address, port), timeout=timeout)
    try:
        set_keepalive(sock)
        sock.settimeout(None)
    except OSError:
        sock.close()
        raise
    return LineSocket(sock)


def worker_opening(channel: LineSocket) -> str:
    """The worker's challenge; ControlError when what answers is not an mpi-worker."""
    opening = channel.receive(HELLO_TIMEOUT)
    if not opening or opening.get("protocol") != PROTOCOL or not opening.get("challenge"):
        raise ControlError("it does not speak the trainhook MPI control protocol (is it running "
                           "`trainhook-launch mpi-worker`?)")
    return str(opening["challenge"])


def worker_answer(channel: LineSocket, token: bytes, mine: str) -> dict:
    """The worker's answer to our hello, its proof checked; WorkerRefused/ControlError otherwise."""
    answer = channel.receive(HELLO_TIMEOUT)
    if answer is None:
        raise ControlError("it closed the connection without answering" if channel.closed else
                           f"no answer within {HELLO_TIMEOUT:g}s")
    if not answer.get("ok"):
        raise WorkerRefused(f"it refused: {answer.get('error', 'no reason given')}")
    if not hmac.compare_digest(str(answer.get("proof", "")), proof(token, "worker", mine)):
        raise WorkerRefused("it does not hold this gang's key")
    return answer


@dataclass
class WorkerLink:
    """The launcher's open connection to one worker."""

    peer: Peer
    channel: LineSocket
    slots: int
    lost: bool = False

    def tell_exit(self, code: int, why: str) -> None:
        """Send the outcome; errors are ignored (a worker that is gone needs no news)."""
        if self.channel.closed:
            return
        try:
            self.channel.send({"exit": code, "why": why})
        except OSError:
            self.channel.closed = True

    def wait_bye(self, timeout: float) -> None:
        try:
            self.channel.receive(timeout)
        except (OSError, ControlError):
            pass
        self.channel.close()


def connect_worker(gang: GangView, peer: Peer, port: int, token: bytes, setup: Setup,
                   timeout: float = 3.0) -> WorkerLink:
    """Open the control connection to one worker, authenticated both ways; raises OSError or ControlError."""
    channel = open_channel(peer.address, port, timeout)
    try:
        theirs, mine = worker_opening(channel), challenge()
        channel.send(control_hello(gang, token, theirs, mine, setup))
        answer = worker_answer(channel, token, mine)
        slots = answer.get("slots")
        if not isinstance(slots, int) or slots < 1:
            raise ControlError(f"it reported no usable slot count ({slots!r})")
        return WorkerLink(peer, channel, slots)
    except BaseException:
        channel.close()
        raise


def connect_spawn(gang: GangView, address: str, port: int, token: bytes, command: str,
                  timeout: float = 3.0) -> LineSocket:
    """A spawn connection to the worker at `address`, authenticated both ways and accepted; what follows on it is
    gang_transport's frames. Raises OSError or ControlError (WorkerRefused when the worker said no)."""
    channel = open_channel(address, port, timeout)
    try:
        theirs, mine = worker_opening(channel), challenge()
        channel.send(spawn_hello(gang, token, theirs, mine, command))
        worker_answer(channel, token, mine)
        return channel
    except BaseException:
        channel.close()
        raise
