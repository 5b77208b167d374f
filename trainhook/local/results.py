"""What a local run's pods did, and where their output goes: the records `Supervisor` keeps and reports.

Kept apart from the supervisor (which runs the containers) so that the summary, outcome.json and the tests read
one definition of a pod's and a run's result.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

_CHUNK = 65536
# containerd's max_container_log_line_size: a longer line is logged in pieces of this size.
MAX_LINE = 16 * 1024


@dataclass
class ContainerResult:
    name: str
    kind: str
    exit_code: int | None = None  # None: never started, or still running when the run ended
    started: float | None = None
    finished: float | None = None
    stopped: bool = False  # the supervisor sent it SIGTERM (the run was ending, or it was a sidecar)
    gang_aware: bool = False  # run under `trainhook-launch run`: its gang's outcome judges it, not its code

    @property
    def failed(self) -> bool:
        """Exited non-zero on its own (not because it was told to stop)."""
        return bool(self.exit_code) and not self.stopped and self.kind != "sidecar" and not self.gang_aware


@dataclass
class PodResult:
    name: str
    rank: str
    containers: list[ContainerResult] = field(default_factory=list)
    reason: str = "Pending"  # Completed, Error, Init:Error, Terminated, Parked, Deleted, Pending (see shown_status)
    training: str = ""  # the training container's name
    training_exit: int | None = None  # a gang-aware pod's training command's last exit code (its launcher's)
    gang: str = ""  # namespace/job of a gang-aware pod

    @property
    def exit_code(self) -> int | None:
        """The training's exit code (a gang-aware pod's training command's own), or the failed init container's."""
        failed_init = [c for c in self.containers if c.kind == "init" and c.exit_code]
        if failed_init:
            return failed_init[0].exit_code
        if self.training_exit is not None:
            return self.training_exit
        training = [c for c in self.containers if c.kind == "main" and c.name == self.training] or \
            [c for c in self.containers if c.kind == "main"]
        return training[0].exit_code if training else None

    @property
    def restarts(self) -> int:
        """How often the training container was restarted (the kubelet's restartCount)."""
        return max(0, len([c for c in self.containers if c.kind == "main" and c.name == self.training]) - 1)

    @property
    def duration(self) -> float | None:
        starts = [c.started for c in self.containers if c.started is not None]
        ends = [c.finished for c in self.containers if c.finished is not None]
        return max(ends) - min(starts) if starts and ends else None

    def shown_status(self, gangs: dict[str, dict]) -> str:
        """The summary's STATUS. A pod parked after its gang succeeded shows `Succeeded`: parking is how its
        launcher kept a StatefulSet's pod from rerunning the finished training (on a cluster the notary then scales
        it away), a mechanism, not the pod's result. After a failure it stays `Parked`, its own code in EXIT."""
        if self.reason == "Parked" and (gangs.get(self.gang) or {}).get("phase") == "Succeeded":
            return "Succeeded"
        return self.reason


@dataclass
class RunResult:
    pods: list[PodResult]
    exit_code: int
    reason: str  # Succeeded, Failed, Timeout, Interrupted
    first_failure: str = ""  # "pod/container exited with N", or "gang NS/JOB failed: ..."
    gangs: dict[str, dict] = field(default_factory=dict)  # "namespace/job" -> its outcome, as its launchers say


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

    async def pump(self, readers: list[asyncio.StreamReader], prefix: str, log_path: Path) -> None:
        """A container's stdout and stderr into its log, each stream a whole line at a time, as a kubelet's
        container runtime logs them (CRI splits each stream at its newlines: two streams interleave between lines,
        never within one, and a line longer than MAX_LINE is cut into pieces, so no stream holds unbounded
        memory)."""
        tag = f"[{prefix}] ".encode()
        mode = "ab" if log_path in self._opened else "wb"
        self._opened.add(log_path)
        with open(log_path, mode) as log:
            def write(piece: bytes, end: bytes = b"") -> None:
                log.write(piece + end)
                self.line(tag, piece)

            def cut(data: bytes) -> bytes:
                """Write `data` in pieces of MAX_LINE while more than MAX_LINE is left; return what is left."""
                while len(data) > MAX_LINE:
                    write(data[:MAX_LINE])
                    data = data[MAX_LINE:]
                return data

            async def follow(reader: asyncio.StreamReader) -> None:
                pending = b""
                while chunk := await reader.read(_CHUNK):
                    *lines, pending = (pending + chunk).split(b"\n")
                    for line in lines:
                        write(cut(line), b"\n")
                    pending = cut(pending)
                    log.flush()
                if pending:
                    write(pending)
                    log.flush()

            await asyncio.gather(*(follow(reader) for reader in readers))
