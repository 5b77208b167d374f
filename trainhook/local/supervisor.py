"""Run the pods' containers as a kubelet would, and end the run as a gang.

Per pod: init containers one by one (sidecars, `restartPolicy: Always`, are started and left running), then all
containers at once; the pod is done when its containers have exited, and its sidecars are then stopped.
The run ends when every pod is done, when a training or init container fails (the others get SIGTERM, then
SIGKILL after the grace period), on the timeout, or on SIGINT/SIGTERM. Each container runs once: a restart
policy, when added, belongs in `_run_pod` (the place a kubelet's pod worker loops).

A container's process is started in its own session, and when it exits the rest of its process group is
killed, as a runtime tears a container down when its main process ends. SIGTERM goes to the main process only,
as the kubelet sends it, so the program gets the chance to forward it (torchrun does).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from trainhook.local.pods import ContainerSpec, LocalPod

EXIT_TIMEOUT = 124
_CHUNK = 65536


async def exited(proc: asyncio.subprocess.Process, poll: float = 0.05) -> int:
    """The main process's exit status, as soon as it has exited. (`proc.wait()` also waits for its stdout to
    close, which a process left behind in the container can hold open; the container ends with its main
    process, so the supervisor waits for this instead.)"""
    while proc.returncode is None:
        await asyncio.sleep(poll)
    return proc.returncode


def exit_code(returncode: int) -> int:
    """A process's status as Kubernetes reports a container's: 128+N when killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


@dataclass
class ContainerResult:
    name: str
    kind: str
    exit_code: int | None = None  # None: never started, or still running when the run ended
    started: float | None = None
    finished: float | None = None
    stopped: bool = False  # the supervisor sent it SIGTERM (the run was ending, or it was a sidecar)

    @property
    def failed(self) -> bool:
        """Exited non-zero on its own (not because it was told to stop)."""
        return bool(self.exit_code) and not self.stopped and self.kind != "sidecar"


@dataclass
class PodResult:
    name: str
    rank: str
    containers: list[ContainerResult] = field(default_factory=list)
    reason: str = "Pending"  # Completed, Error, Init:Error, Terminated, Pending

    @property
    def exit_code(self) -> int | None:
        """The training container's exit code, or the failed init container's."""
        failed_init = [c for c in self.containers if c.kind == "init" and c.exit_code]
        if failed_init:
            return failed_init[0].exit_code
        training = [c for c in self.containers if c.kind == "main"]
        return training[0].exit_code if training else None

    @property
    def duration(self) -> float | None:
        starts = [c.started for c in self.containers if c.started is not None]
        ends = [c.finished for c in self.containers if c.finished is not None]
        return max(ends) - min(starts) if starts and ends else None


@dataclass
class RunResult:
    pods: list[PodResult]
    exit_code: int
    reason: str  # Succeeded, Failed, Timeout, Interrupted
    first_failure: str = ""  # "pod/container exited with N"


class Output:
    """Writes container output to the terminal, one prefixed line at a time, and to per-container log files."""

    def __init__(self, stream: BinaryIO, log_dir: Path):
        self.stream: BinaryIO | None = stream
        self.log_dir = log_dir
        self._opened: set[Path] = set()  # logs started by this run: a kept --workdir starts fresh ones

    def log_path(self, pod: str, container: str) -> Path:
        path = self.log_dir / pod / f"{container}.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def line(self, prefix: bytes, data: bytes) -> None:
        if self.stream is None:
            return
        try:
            self.stream.write(prefix + data.rstrip(b"\r\n") + b"\n")
            self.stream.flush()
        except (BrokenPipeError, ValueError):
            self.stream = None  # the reader went away (`| head`): the log files still get everything

    async def pump(self, reader: asyncio.StreamReader, prefix: str, log_path: Path) -> None:
        tag = f"[{prefix}] ".encode()
        pending = b""
        mode = "ab" if log_path in self._opened else "wb"
        self._opened.add(log_path)
        with open(log_path, mode) as log:
            while chunk := await reader.read(_CHUNK):
                log.write(chunk)
                log.flush()
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    self.line(tag, line)
        if pending:
            self.line(tag, pending)


class Supervisor:
    def __init__(self, pods: list[LocalPod], output: Output, timeout: float | None = None,
                 grace_seconds: float | None = None):
        self.pods = pods
        self.output = output
        self.timeout = timeout
        self.grace_override = grace_seconds
        self.results = {p.name: PodResult(p.name, p.rank) for p in pods}
        self._live: dict[asyncio.subprocess.Process, LocalPod] = {}
        self._records: dict[asyncio.subprocess.Process, ContainerResult] = {}
        self._stopping = False
        self._reason = "Succeeded"
        self._exit_code = 0
        self._first_failure = ""
        self._stop_tasks: set[asyncio.Task] = set()

    # --- entry --------------------------------------------------------------------------------------------
    async def run(self) -> RunResult:
        loop = asyncio.get_running_loop()
        handled = []
        for signum, code in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
            try:
                loop.add_signal_handler(signum, self._interrupted, code)
                handled.append(signum)
            except (RuntimeError, ValueError):  # not the main thread: the caller handles signals
                pass
        pod_tasks = [asyncio.create_task(self._run_pod(pod)) for pod in self.pods]
        try:
            done, pending = await asyncio.wait(pod_tasks, timeout=self.timeout)
            if pending:
                self._stop("Timeout", EXIT_TIMEOUT, f"timed out after {self.timeout:g}s")
                await asyncio.wait(pending)
            await asyncio.gather(*pod_tasks)  # re-raise an unexpected error from a pod task
            while self._stop_tasks:
                await asyncio.gather(*list(self._stop_tasks))
        finally:
            for signum in handled:
                loop.remove_signal_handler(signum)
            self.kill_all()
        return self._outcome()

    def _outcome(self) -> RunResult:
        pods = [self.results[p.name] for p in self.pods]
        if self._reason == "Succeeded":
            # No training container failed, but another one may have: the run still did not succeed.
            failed = sorted(((c.finished or 0, p.name, c) for p in pods for c in p.containers if c.failed),
                            key=lambda item: item[:2])
            if failed:
                _, name, record = failed[0]
                return RunResult(pods, record.exit_code or 1, "Failed",
                                 f"{name}/{record.name} exited with {record.exit_code}")
        return RunResult(pods, self._exit_code, self._reason, self._first_failure)

    def kill_all(self) -> None:
        """SIGKILL every process group still alive (the last resort of every exit path)."""
        for proc in list(self._live):
            _killpg(proc.pid, signal.SIGKILL)

    # --- ending the run -----------------------------------------------------------------------------------
    def _interrupted(self, code: int) -> None:
        if self._stopping:
            self.kill_all()  # interrupted while stopping: no more grace
            return
        self._stop("Interrupted", code, f"interrupted by {signal.Signals(code - 128).name}")

    def _stop(self, reason: str, code: int, why: str) -> None:
        """Stop every running container (SIGTERM, then SIGKILL after the grace period); nothing new starts."""
        if self._stopping:
            return
        self._stopping = True
        self._reason, self._exit_code = reason, code
        if not self._first_failure:
            self._first_failure = why
        for proc, pod in list(self._live.items()):
            self._terminate_later(proc, pod)

    def _terminate_later(self, proc: asyncio.subprocess.Process, pod: LocalPod) -> None:
        if proc in self._records:
            self._records[proc].stopped = True
        task = asyncio.create_task(self._terminate(proc, pod))
        self._stop_tasks.add(task)
        task.add_done_callback(self._stop_tasks.discard)

    async def _terminate(self, proc: asyncio.subprocess.Process, pod: LocalPod) -> None:
        grace = pod.grace_seconds if self.grace_override is None else self.grace_override
        if proc.returncode is None:
            try:
                proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                await asyncio.wait_for(exited(proc), timeout=grace)
            except asyncio.TimeoutError:
                pass
        _killpg(proc.pid, signal.SIGKILL)

    def _failed(self, pod: LocalPod, spec: ContainerSpec, code: int) -> None:
        if not self._stopping:
            self._stop("Failed", code, f"{pod.name}/{spec.name} exited with {code}")

    # --- pods and containers ------------------------------------------------------------------------------
    async def _run_pod(self, pod: LocalPod) -> None:
        """A kubelet's pod worker, minus restarts: init containers in order, then every container at once.
        (A restart policy, when added, loops here: rerun a failed container instead of reporting it.)"""
        result = self.results[pod.name]
        sidecars: list[asyncio.Task] = []
        initialized = True
        for spec in pod.init_containers:
            if self._stopping:
                initialized = False
                break
            if spec.kind == "sidecar":
                sidecars.append(asyncio.create_task(self._run_container(pod, spec, result)))
                continue
            result.reason = "Init:Running"
            code = await self._run_container(pod, spec, result)
            if code != 0:
                initialized = False
                record = result.containers[-1]
                result.reason = "Terminated" if record.stopped or code is None else "Init:Error"
                self._failed(pod, spec, 1 if code is None else code)
                break
        if initialized and not self._stopping:
            result.reason = "Running"
            await asyncio.gather(*(self._run_container(pod, s, result) for s in pod.containers))
            mains = [c for c in result.containers if c.kind == "main"]
            result.reason = ("Error" if any(c.failed for c in mains) else
                             "Terminated" if any(c.stopped for c in mains) else "Completed")
        elif result.reason in ("Pending", "Init:Running"):
            result.reason = "Terminated" if result.containers else "Pending"
        await self._stop_sidecars(pod, sidecars)

    async def _stop_sidecars(self, pod: LocalPod, sidecars: list[asyncio.Task]) -> None:
        for proc, owner in list(self._live.items()):
            if owner is pod:  # only sidecars can still be running here
                self._terminate_later(proc, pod)
        if sidecars:
            await asyncio.gather(*sidecars)

    async def _run_container(self, pod: LocalPod, spec: ContainerSpec, result: PodResult) -> int | None:
        record = ContainerResult(spec.name, spec.kind)
        result.containers.append(record)
        if self._stopping:
            return None
        prefix = pod.name if spec.training else f"{pod.name}/{spec.name}"
        log_path = self.output.log_path(pod.name, spec.name)
        argv = pod.entry_argv(spec)
        record.started = time.monotonic()
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, env=spec.env, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT, start_new_session=True)
        except OSError as e:
            self.output.line(f"[{prefix}] ".encode(), f"cannot start: {e}".encode())
            record.exit_code, record.finished = 128, time.monotonic()
            return record.exit_code
        self._live[proc] = pod
        self._records[proc] = record
        if self._stopping:
            self._terminate_later(proc, pod)
        assert proc.stdout is not None  # PIPE
        pump = asyncio.create_task(self.output.pump(proc.stdout, prefix, log_path))
        try:
            returncode = await exited(proc)
        finally:
            # The main process is gone: the rest of the container goes with it.
            _killpg(proc.pid, signal.SIGKILL)
            self._live.pop(proc, None)
            self._records.pop(proc, None)
        try:
            await asyncio.wait_for(pump, timeout=5)
            await asyncio.wait_for(proc.wait(), timeout=5)  # pipes closed: let asyncio finish the transport
        except asyncio.TimeoutError:
            pass
        record.exit_code, record.finished = exit_code(returncode), time.monotonic()
        if record.exit_code != 0 and (spec.training or spec.kind == "init"):
            self._failed(pod, spec, record.exit_code)
        return record.exit_code


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
