"""`trainhook-launch mpi-worker [-- CMD ARGS]`: keep an MPI worker pod up for its launcher, then end with it.

A worker pod's container has nothing of its own to run: mpirun's daemons are started in it from outside (by this
very process for the default `gang` transport, else through the exec API, ssh or the local transport). This
command keeps the container alive while they are needed and no longer: it listens on the control port
(mpi_control; the listener is mpi_doorman's Doorman), answers the launcher's hello with this pod's slots, runs
the launcher's authenticated spawn requests (mpi_spawn), and exits with the outcome the launcher sends at the
end (0 when the training succeeded). It exits
EXIT_LAUNCHER_LOST (129) when the launcher's connection closes without an outcome, or when no launcher has come
within TRAINHOOK_WAIT_TIMEOUT, so no worker outlives its launcher.

CMD, when given, runs beside it for the worker's lifetime: the ssh transport's sshd (`-- /usr/sbin/sshd -De`),
as mpi-operator v2 workers run it. CMD is stopped (SIGTERM, then SIGKILL) when the worker ends; if it exits
first, the worker fails with its code. SIGTERM/SIGINT end the worker with 128+N. As a container's PID 1 it reaps
the orphans the daemons leave behind (handing the spawned commands' statuses to mpi_spawn.Children). Whatever it
spawned is killed when it ends.
"""

from __future__ import annotations

import os
import random
import select
import signal
import subprocess
import threading
import time
from typing import Callable, Mapping, Sequence

from trainhook.gang import keys
from trainhook.launcher import notary_client
from trainhook.launcher.mpi import control
from trainhook.launcher.mpi.doorman import Doorman
from trainhook.launcher.mpi.spawn import Children
from trainhook.launcher.pod_view import ConfigError, GangView
from trainhook.launcher.process import exit_code
from trainhook.launcher.reach import listen
from trainhook.gang.wiring import TH_MPI_SLOTS
from trainhook.launcher.speak import speaker

STOP_GRACE = 5.0
POLL = 0.25
EXIT_SERVICE_FAILED = 1


say = speaker("mpi-worker")


ASK_WINDOW = 30.0  # one round of gang_key's own jittered asking (0.2-2 s apart) ...
ASK_PAUSE_MAX = 30.0  # ... then a pause growing from 1 s to this before the next round


class KeyFromNotary:
    """A worker's gang key, asked for in the background until the notary gives it (issue 31): the worker listens
    at once, refuses every launcher while it has none (NO_KEY, which the launcher retries), and never falls back
    to an empty key. `ask` is how one round asks (notary_client.gang_key by default)."""

    def __init__(self, env: Mapping[str, str], say: Callable[[str], None],
                 ask: Callable[[float], bytes] | None = None):
        self.env, self.say, self.ask = env, say, ask
        self.key, self.why = b"", "not asked yet"
        self.done = threading.Event()

    def start(self) -> KeyFromNotary:
        threading.Thread(target=self._run, daemon=True, name="trainhook-gang-key").start()
        return self

    def get(self) -> bytes:
        return self.key

    def _run(self) -> None:
        ask = self.ask
        if ask is None:
            try:
                notary = notary_client.from_env(self.env)
            except notary_client.NotaryError as e:
                self.why = str(e)
                self.say(f"no gang key: {e}; this worker accepts no launcher")
                return
            if notary is None:
                self.why = f"{keys.TH_NOTARY} is not set (a webhook without a notary?)"
                self.say(f"no gang key: {self.why}; this worker accepts no launcher")
                return
            namespace, job = self.env.get(keys.TH_NAMESPACE, ""), self.env.get(keys.TH_JOB_NAME, "")
            ask = lambda window: notary.gang_key(namespace, job, window, self.say)  # noqa: E731
        pause = 1.0
        while not self.done.is_set():
            try:
                self.key = ask(ASK_WINDOW)
                if self.key:
                    return
            except notary_client.NotaryError as e:
                self.why = str(e)
                self.say(f"still no gang key ({e}); this worker accepts no launcher until it has one, asking again "
                         f"in {pause:g}s")
            self.done.wait(random.uniform(pause / 2, pause))
            pause = min(pause * 2, ASK_PAUSE_MAX)


def own_slots(env: Mapping[str, str]) -> int:
    text = env.get(TH_MPI_SLOTS, "").strip() or "1"
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(f"{TH_MPI_SLOTS}={text!r}: not a slot count")
    return int(text)


class Service:
    """CMD run beside the worker (e.g. sshd); its exit status is collected here, also when we are PID 1."""

    def __init__(self, argv: Sequence[str], children: Children | None = None):
        self.argv = list(argv)
        self.proc: subprocess.Popen[bytes] | None = None
        self.status: int | None = None
        self.children = children or Children()

    def start(self) -> None:
        if self.argv:
            self.proc = subprocess.Popen(self.argv)
            say(f"started {' '.join(self.argv)} (pid {self.proc.pid})")

    def reap(self, everything: bool) -> None:
        """Collect our service's status; as PID 1 also every orphan re-parented to us."""
        if self.proc is None and not everything:
            return
        while True:
            try:
                pid, status = os.waitpid(-1 if everything else self.proc.pid, os.WNOHANG)  # type: ignore[union-attr]
            except ChildProcessError:
                return
            if pid == 0:
                return
            if self.proc is not None and pid == self.proc.pid:
                self.status = exit_code(status)
                self.proc.returncode = self.status
                if not everything:
                    return
            else:
                self.children.deliver(pid, status)

    def stop(self) -> None:
        if self.proc is None or self.status is not None:
            return
        try:
            self.proc.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + STOP_GRACE
        while self.status is None and time.monotonic() < deadline:
            self.reap(everything=False)
            time.sleep(0.05)
        if self.status is None:
            self.proc.kill()
            self.proc.wait()


def serve(gang: GangView, env: Mapping[str, str], command: Sequence[str] = ()) -> int:
    """Run the worker until its launcher ends; returns the exit code (the launcher's outcome)."""
    port = control.control_port(gang)
    slots = own_slots(env)
    try:
        server = listen(port)
    except OSError as e:
        say(f"cannot listen on the control port {port}: {e.strerror or e}")
        return EXIT_SERVICE_FAILED
    received: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        received.append(signum)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    children = Children()
    pid1 = children.reaps_all = os.getpid() == 1
    service = Service(command, children)
    doorman = Doorman(gang, slots, KeyFromNotary(env, say).start().get, say, children, env)
    launcher: control.LineSocket | None = None
    deadline = time.monotonic() + gang.wait_timeout
    say(f"{gang.me} waiting for the launcher on port {port} ({slots} slot{'s' if slots != 1 else ''})")
    try:
        try:
            service.start()
        except OSError as e:
            say(f"cannot start {service.argv[0]}: {e.strerror or e}")
            return 127 if isinstance(e, FileNotFoundError) else 126
        while True:
            if received:
                say(f"stopped by {signal.Signals(received[0]).name}")
                return 128 + received[0]
            service.reap(everything=pid1)
            if service.status is not None:
                say(f"{' '.join(service.argv)} exited with {service.status} before the launcher finished")
                return service.status or EXIT_SERVICE_FAILED
            if launcher is None:
                launcher = doorman.attached()
            if launcher is None and time.monotonic() > deadline:
                say(f"no launcher connected within {gang.wait_timeout:g}s (control port {port}); "
                    f"exiting {control.EXIT_LAUNCHER_LOST}")
                return control.EXIT_LAUNCHER_LOST
            watched: list = [server] + ([launcher] if launcher else [])
            try:
                readable, _, _ = select.select(watched, [], [], POLL)
            except InterruptedError:
                continue
            if server in readable:
                doorman.admit(server)
            if launcher is not None and launcher in readable:
                outcome = launcher_exit_code(launcher)
                if outcome is not None:
                    return outcome
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if launcher is not None:
            launcher.close()
        server.close()
        children.stop_all()
        service.stop()


def launcher_exit_code(launcher: control.LineSocket) -> int | None:
    """The exit code once the launcher has sent its outcome or gone away; None while the run goes on."""
    try:
        alive = launcher.feed()
        message = launcher.pending()
    except control.ControlError as e:
        say(f"launcher sent garbage ({e}); treating it as lost")
        return control.EXIT_LAUNCHER_LOST
    if message is not None and "exit" in message:
        code = message["exit"] if isinstance(message["exit"], int) and 0 <= message["exit"] <= 255 else 1
        try:
            launcher.send({"bye": True})
        except OSError:
            pass
        say(f"launcher finished: {message.get('why') or 'no reason given'}; exiting {code}")
        return code
    if not alive:
        say(f"the launcher's connection closed without an outcome; exiting {control.EXIT_LAUNCHER_LOST}")
        return control.EXIT_LAUNCHER_LOST
    return None
