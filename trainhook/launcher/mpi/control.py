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

Both ends prove they hold the gang's key (`gang_token`), and every message after the greetings is signed: each
side sends a random challenge and the other's hello/answer carries HMAC-SHA256(key, role + challenge + the whole
message), so nothing outside the gang can end a worker, install an agent in it, have it spawn a command, change the
command on the way (an on-path relay, or a pod answering for a worker's name: issue 31), or pose as a worker. From
the two challenges both ends derive the connection's session key (`session_key`); the control messages that follow
(`exit`, `bye`) are signed with it and a per-direction counter (LineSocket.secure), and a spawn connection's
frames too (gang_transport.FrameSigner), so a frame injected, replayed, reordered or reflected mid-stream is refused.
The key never crosses the network; the session key is valid on one connection only.

A worker that has no key (no notary answered yet, or none is named) refuses every launcher, saying so, and keeps
asking the notary in the background (worker.KeyFromNotary): an empty key is one anybody holds.

Wire format: one JSON object per line.
  worker -> launcher  {"protocol": "trainhook-mpi/2", "challenge": C1}
  launcher -> worker  {"protocol": ..., "namespace": NS, "job": JOB, "launcher": ADDRESS, "challenge": C2,
                       "transport": T, "agent": PATH, "run_dir": DIR, "proof": P(launcher, C1, message)}
  worker -> launcher  {"ok": true, "slots": N, "proof": P(worker, C2, message)}  |  {"ok": false, "error": WHY}
  then, signed with the session key:   {"seq": n, "body": BODY, "mac": M}
  launcher -> worker  BODY {"exit": CODE, "why": TEXT}
  worker -> launcher  BODY {"bye": true}
The worker installs the rsh agent at PATH (under /etc/mpi only) before it answers.

A spawn (the `gang` transport, gang_transport): a second connection whose hello carries `"spawn": WORDS` instead of
the transport/agent fields (inside the proof: the command is what the key vouches for); the worker answers
{"ok": true, "proof": ...} (only while it serves a launcher), and from then on both ends speak gang_transport's
signed binary frames on the same connection.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import select
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Mapping

from trainhook.gang import keys
from trainhook.launcher.pod_view import GangView, Peer
from trainhook.launcher.wire import json_object, same_mac, set_keepalive

PROTOCOL = "trainhook-mpi/2"  # /1 signed only the challenge, not the message (issue 31)
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


def proven_part(message: dict) -> str:
    """What a proof covers: the message as sorted compact JSON, without its proof."""
    return json.dumps({k: v for k, v in message.items() if k != "proof"}, sort_keys=True, separators=(",", ":"))


def proof(token: bytes, role: str, challenge: str, message: dict) -> str:
    """HMAC of the whole message (every field but the proof) under the peer's fresh challenge: a relay that changes
    any field (the command, the agent's path, the slots) or replays a message on another connection is refused."""
    text = "|".join((PROTOCOL, role, challenge, proven_part(message)))
    return hmac.new(token, text.encode(), hashlib.sha256).hexdigest()


def signed(token: bytes, role: str, challenge: str, message: dict) -> dict:
    return {**message, "proof": proof(token, role, challenge, message)}


def session_key(token: bytes, worker_challenge: str, launcher_challenge: str) -> bytes:
    """The key of one connection, from both fresh challenges: what signs its later messages and frames, and what
    the launcher's doorway may hand an rsh agent (it opens nothing but this connection)."""
    text = "|".join((PROTOCOL, "session", worker_challenge, launcher_challenge))
    return hmac.new(token, text.encode(), hashlib.sha256).digest()


def line_mac(key: bytes, direction: str, seq: int, body: dict) -> str:
    text = "|".join((PROTOCOL, direction, str(seq), json.dumps(body, sort_keys=True, separators=(",", ":"))))
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


TO_WORKER, TO_LAUNCHER = "l2w", "w2l"


def challenge() -> str:
    return secrets.token_hex(16)



class LineSocket:
    """A socket read one JSON line at a time (with its own buffer, so select() stays usable on `sock`)."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buffer = b""
        self.closed = False
        self.session = b""  # the connection's session key, once both ends proved the gang's key
        self.directions = ("", "")  # (ours, theirs) once secured
        self.sent = self.received = 0
        self.lock = threading.Lock()

    def fileno(self) -> int:
        return self.sock.fileno()

    def secure(self, session: bytes, outgoing: str, incoming: str) -> None:
        """From now on every message is signed with `session` and counted per direction (both ends call this right
        after the handshake): one injected, replayed, reordered or reflected is refused as a ControlError."""
        self.session, self.directions = session, (outgoing, incoming)

    def send(self, message: dict) -> None:
        with self.lock:
            if self.session:
                message = {"seq": self.sent, "body": message,
                           "mac": line_mac(self.session, self.directions[0], self.sent, message)}
                self.sent += 1
            self.sock.sendall(json.dumps(message, separators=(",", ":")).encode() + b"\n")

    def pending(self) -> dict | None:
        """A complete message already buffered, if any (checked, once secured)."""
        if b"\n" not in self.buffer:
            return None
        line, self.buffer = self.buffer.split(b"\n", 1)
        message = json_object(line)
        if message is None:
            raise ControlError(f"not a trainhook control message: {line[:80]!r}")
        return self.check(message) if self.session else message

    def check(self, message: dict) -> dict:
        body, seq, mac = message.get("body"), message.get("seq"), message.get("mac")
        if not isinstance(body, dict) or not isinstance(seq, int) or not isinstance(mac, str):
            raise ControlError("an unsigned message on a signed control connection (injected?)")
        if seq != self.received:
            raise ControlError(f"message {seq} out of order (expected {self.received}): a replay")
        if not same_mac(mac, line_mac(self.session, self.directions[1], seq, body)):
            raise ControlError("a message not signed with this connection's key (injected or forged)")
        self.received += 1
        return body

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
    return signed(token, "launcher", worker_challenge, {
        "protocol": PROTOCOL, "namespace": gang.namespace, "job": gang.job_name, "launcher": gang.address,
        "challenge": own_challenge, "transport": setup.transport, "agent": setup.agent, "run_dir": setup.run_dir})


def spawn_hello(gang: GangView, token: bytes, worker_challenge: str, own_challenge: str, command: str) -> dict:
    return signed(token, "launcher", worker_challenge, {
        "protocol": PROTOCOL, "namespace": gang.namespace, "job": gang.job_name, "launcher": gang.address,
        "challenge": own_challenge, "spawn": command})


def authenticate(gang: GangView, token: bytes, sent_challenge: str, message: dict | None) -> str:
    """'' when `message` is a hello from a holder of this gang's key, with every field as it signed it, else why
    it is refused. An empty key is refused outright: anybody can compute an HMAC under it."""
    if not message or message.get("protocol") != PROTOCOL:
        return "not a trainhook MPI launcher" + (f" of this version ({message.get('protocol')}, not {PROTOCOL})"
                                                 if message and message.get("protocol") else "")
    if (message.get("namespace"), message.get("job")) != (gang.namespace, gang.job_name):
        return (f"launcher of gang {message.get('namespace')}/{message.get('job')}, not "
                f"{gang.namespace}/{gang.job_name}")
    if not token:
        return NO_KEY
    if not isinstance(message.get("challenge"), str) or len(message["challenge"]) < 16:
        return "a hello without a challenge"
    if not same_mac(str(message.get("proof", "")), proof(token, "launcher", sent_challenge, message)):
        return ("the launcher does not hold this gang's key, or its hello was changed on the way (were the pods "
                "admitted by different webhooks?)")
    return ""


NO_KEY = ("this worker has no gang key yet (the notary has not given it one), so it accepts no launcher; it keeps "
          "asking the notary")


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
        if answer.get("retry"):  # a worker still waiting for its key: ask again until the deadline
            raise ControlError(f"it refused for now: {answer.get('error', 'no reason given')}")
        raise WorkerRefused(f"it refused: {answer.get('error', 'no reason given')}")
    if not same_mac(str(answer.get("proof", "")), proof(token, "worker", mine, answer)):
        raise WorkerRefused("it does not hold this gang's key, or its answer was changed on the way")
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
    if not token:
        raise WorkerRefused("this launcher has no gang key (the notary gave it none): no worker accepts it")
    channel = open_channel(peer.address, port, timeout)
    try:
        theirs, mine = worker_opening(channel), challenge()
        channel.send(control_hello(gang, token, theirs, mine, setup))
        answer = worker_answer(channel, token, mine)
        slots = answer.get("slots")
        if not isinstance(slots, int) or slots < 1:
            raise ControlError(f"it reported no usable slot count ({slots!r})")
        channel.secure(session_key(token, theirs, mine), TO_WORKER, TO_LAUNCHER)
        return WorkerLink(peer, channel, slots)
    except BaseException:
        channel.close()
        raise


def connect_spawn(gang: GangView, address: str, port: int, token: bytes, command: str,
                  timeout: float = 3.0) -> LineSocket:
    """A spawn connection to the worker at `address`, authenticated both ways and accepted, with the command inside
    the proof; what follows on it is gang_transport's frames, signed with `channel.session`. Raises OSError or
    ControlError (WorkerRefused when the worker said no)."""
    if not token:
        raise WorkerRefused("this launcher has no gang key (the notary gave it none): no worker accepts it")
    channel = open_channel(address, port, timeout)
    try:
        theirs, mine = worker_opening(channel), challenge()
        channel.send(spawn_hello(gang, token, theirs, mine, command))
        worker_answer(channel, token, mine)
        channel.session = session_key(token, theirs, mine)
        return channel
    except BaseException:
        channel.close()
        raise
