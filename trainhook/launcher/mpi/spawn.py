"""The worker's side of the `gang` transport (gang_transport): run one spawn's `/bin/sh -c "WORDS"` and stream it.

The command runs as `kubectl exec` would run it in this container: `/bin/sh -c` with the words joined by spaces
(kubexec's quoting rules: mpirun's words are meant for a remote shell), the container's environment (mpi-worker's
own, minus any gang secret), its working directory. It gets its own session and process group, so that ending
it ends what it started (orted and its ranks, hydra_pmi_proxy and its ranks).

- The agent's connection closing (the agent killed by any signal, its pod gone) stops the command: SIGTERM to
  its process group, SIGKILL after KILL_GRACE.
- The command's end ends the agent: once it has exited and its stdout and stderr are drained (or DRAIN_GRACE
  after its exit, when a background child keeps them open), the EXIT frame carries its code (128+N for a signal).
- Bounded: one read of at most MAX_FRAME per pipe at a time, sent before the next (TCP and the pipes push back);
  at most MAX_SPAWNS commands at once.

`Children` keeps the exit statuses straight when mpi-worker is a container's PID 1: there the main loop reaps
every orphan with waitpid(-1), which would otherwise steal a spawned command's status from its Popen.
"""

from __future__ import annotations

import errno
import os
import select
import signal
import socket
import subprocess
import threading
import time
from typing import Callable, Mapping

from trainhook.gang import keys
from trainhook.launcher.mpi.control import LineSocket
from trainhook.launcher.mpi.gang_transport import (EXIT, EXIT_AGENT_FAILED, MAX_FRAME, START, STDERR, STDIN, STDIN_EOF,
                                                   STDOUT, FrameError, FrameReader, FrameSigner, send_frame)
from trainhook.launcher.process import exit_code

REMOTE_SHELL = "/bin/sh"
KILL_GRACE = 3.0
DRAIN_GRACE = 2.0
LINGER = 5.0  # after EXIT: how long to read what the agent still sends before closing
POLL = 0.2
MAX_SPAWNS = 256
SECRET_VARIABLES = (getattr(keys, "TH_GANG_TOKEN", "TRAINHOOK_GANG_TOKEN"),)


def spawn_env(env: Mapping[str, str]) -> dict[str, str]:
    return {name: value for name, value in env.items() if name not in SECRET_VARIABLES}


class Children:
    """The spawned commands that are running, and their exit codes once they end."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reaps_all = False  # set when this process is PID 1 and its main loop reaps with waitpid(-1)
        self.running: dict[int, subprocess.Popen] = {}
        self.codes: dict[int, int] = {}

    def start(self, command: str, env: Mapping[str, str]) -> subprocess.Popen:
        """Start `/bin/sh -c command` (OSError when it cannot start, or MAX_SPAWNS are already running)."""
        with self.lock:  # the PID-1 reaper's deliver() waits here until the pid is registered
            if len(self.running) >= MAX_SPAWNS:
                raise OSError(errno.EAGAIN, f"{MAX_SPAWNS} commands already running in this worker")
            proc = subprocess.Popen([REMOTE_SHELL, "-c", command], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, env=spawn_env(env), start_new_session=True)
            self.running[proc.pid] = proc
        return proc

    def deliver(self, pid: int, status: int) -> bool:
        """A status the PID-1 reaper collected; True when it was one of ours."""
        with self.lock:
            proc = self.running.get(pid)
            if proc is None:
                return False
            self.codes[pid] = exit_code(status)
            proc.returncode = self.codes[pid]  # so that Popen never waits for it again
            return True

    def poll(self, proc: subprocess.Popen) -> int | None:
        if self.reaps_all:
            with self.lock:
                return self.codes.get(proc.pid)
        code = proc.poll()
        return None if code is None else (128 - code if code < 0 else code)

    def forget(self, proc: subprocess.Popen) -> None:
        with self.lock:
            self.running.pop(proc.pid, None)
            self.codes.pop(proc.pid, None)

    def stop(self, proc: subprocess.Popen) -> int:
        """SIGTERM the command's process group, SIGKILL after KILL_GRACE; its exit code."""
        for sig, grace in ((signal.SIGTERM, KILL_GRACE), (signal.SIGKILL, KILL_GRACE)):
            try:
                os.killpg(proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline:
                code = self.poll(proc)
                if code is not None:
                    return code
                time.sleep(0.05)
        code = self.poll(proc)
        return 128 + signal.SIGKILL if code is None else code

    def stop_all(self) -> None:
        """The worker is ending: nothing it spawned outlives it."""
        with self.lock:
            procs = [p for pid, p in self.running.items() if pid not in self.codes and p.returncode is None]
        for proc in procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def feed_stdin(reader: FrameReader, proc: subprocess.Popen, lost: threading.Event, refused: list[str]) -> None:
    """The agent's frames into the command's stdin until the agent hangs up or a frame fails its check (then
    `lost` is set; `refused` says why a frame was refused)."""
    stdin = proc.stdin
    try:
        while True:
            frame = reader.read()
            if frame is None:
                break
            channel, data = frame
            if channel == STDIN and stdin is not None:
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(stdin.fileno(), view):]
                except (BrokenPipeError, ValueError):
                    pass  # the command closed its stdin or exited: like ssh, what it does not read is dropped
            elif channel == STDIN_EOF and stdin is not None:
                stdin.close()
                stdin = None
    except FrameError as e:
        refused.append(str(e))
    except OSError:
        pass
    lost.set()


def relay_output(sock, signer: FrameSigner, proc: subprocess.Popen, children: Children, lost: threading.Event) -> None:
    """The command's stdout and stderr to the agent until both close (or DRAIN_GRACE after the command ended)."""
    pipes = {proc.stdout.fileno(): STDOUT, proc.stderr.fileno(): STDERR}  # type: ignore[union-attr]
    ended_at = None
    while pipes and not lost.is_set():
        readable, _, _ = select.select(list(pipes), [], [], POLL)
        for fd in readable:
            data = os.read(fd, MAX_FRAME)
            if data:
                send_frame(sock, signer, pipes[fd], data)
            else:
                del pipes[fd]
        if ended_at is None and children.poll(proc) is not None:
            ended_at = time.monotonic()
        if ended_at is not None and time.monotonic() - ended_at > DRAIN_GRACE:
            return


def close_gently(sock, feeder: threading.Thread) -> None:
    """Half-close after EXIT and let the feeder read until the agent hangs up (at most LINGER).

    Closing a TCP socket that still has unread bytes (the agent's STDIN_EOF, or stdin the command never read)
    makes the kernel send a reset instead of a FIN, and a reset can overtake the EXIT frame: the agent then sees
    'connection reset' and exits 255 instead of the command's code. Reading to the agent's own close avoids it."""
    try:
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        return
    feeder.join(LINGER)


def run_spawn(channel: LineSocket, command: str, children: Children, env: Mapping[str, str], deadline: float,
              say: Callable[[str], None], session: bytes) -> None:
    """Serve one authenticated spawn connection to its end (the socket is closed when this returns). Its frames
    are signed with `session` both ways: the first must be the agent's START, and a frame that fails its check
    ends the connection and stops the command, as the agent's going away does."""
    sock = channel.sock
    signer = FrameSigner.worker(session)
    reader = FrameReader(sock, signer, channel.buffer)
    proc = None
    try:
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        first = reader.read()
        if first is None or first[0] != START:
            return
        sock.settimeout(None)
        try:
            proc = children.start(command, env)
        except OSError as e:
            send_frame(sock, signer, STDERR, f"trainhook-launch mpi-worker: cannot run {REMOTE_SHELL}: "
                       f"{e.strerror or e}\n".encode())
            send_frame(sock, signer, EXIT, str(EXIT_AGENT_FAILED).encode())
            return
        lost = threading.Event()
        refused: list[str] = []
        feeder = threading.Thread(target=feed_stdin, args=(reader, proc, lost, refused), daemon=True)
        feeder.start()
        try:
            relay_output(sock, signer, proc, children, lost)
        except OSError:
            lost.set()
        code = children.poll(proc)
        while code is None and not lost.is_set():
            time.sleep(0.05)
            code = children.poll(proc)
        if code is None:
            code = children.stop(proc)
            say(f"refused a frame from the agent of `{command[:60]}` ({refused[0]}); stopped it ({code})" if refused
                else f"the agent of `{command[:60]}` went away; stopped it ({code})")
            return
        send_frame(sock, signer, EXIT, str(code).encode())
        close_gently(sock, feeder)
    except (OSError, FrameError):
        if proc is not None and children.poll(proc) is None:
            children.stop(proc)
    finally:
        if proc is not None:
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                try:
                    if pipe is not None:
                        pipe.close()
                except OSError:
                    pass
            children.forget(proc)
        channel.close()
