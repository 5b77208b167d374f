"""A running training's progress and metrics, as the training reports them (docs/use/progress.md, issue 33).

A training needs no Kubernetes permission and nothing of trainhook to say how far it is: rank 0's launcher gives
its command TRAINHOOK_PROGRESS_FILE, a file the training appends JSON lines to (by hand, or with the SDK's
`trainhook.sdk.progress` helpers). The launcher reads the newest complete line every POLL seconds and forwards it
through the notary (POST /v1/progress, authenticated as rank 0 like the outcome record), which writes it on the
gang's workload and exports it.

Why a file and not an API: the training process may be any language, may not have trainhook installed, and must
never hold the pod's identity token (the launcher keeps it). Why bounded here and again in the notary: the file is
the user's, so a report is cut to what a workload annotation can carry before it leaves the pod (MAX_LINE bytes a
line, MAX_METRICS numeric metrics with short names), and the notary, which cannot trust the pod, applies the same
`normalize` again. Why rate-limited: every forward is a write to the API server, so at most one every `interval`
seconds (TRAINHOOK_PROGRESS_INTERVAL, at least MIN_INTERVAL); reports in between are not queued: only the newest
one counts, and the last one is forwarded when the training ends.

Standard library only, Python 3.8+ (it runs inside the user's image).
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
import time

from trainhook.gang import keys
from trainhook.launcher import files
from trainhook.launcher.speak import speaker

TYPE_CHECKING = False  # typing's own, without importing typing (trainhook/launcher/__init__.py says why)
if TYPE_CHECKING:
    from typing import Callable, Dict, Mapping, Optional

POLL = 1.0  # seconds between looks at the file
DEFAULT_INTERVAL, MIN_INTERVAL = 10.0, 5.0  # seconds between forwards (the notary refuses faster: 429)
MAX_LINE = 4096  # bytes of one JSON line; a longer line is skipped
MAX_READ = 256 * 1024  # bytes read per look; a file that grew more is read from its newest MAX_READ bytes
MAX_METRICS = 16
METRIC_NAME = r"^[A-Za-z_][A-Za-z0-9_./-]{0,63}$"  # compiled on first use (re's cache), not at every start
KNOWN = {"step": "step", "total_steps": "totalSteps", "totalSteps": "totalSteps", "epoch": "epoch",
         "percent": "percent", "progress_percentage": "percent", "progressPercentage": "percent",
         "eta_seconds": "etaSeconds", "etaSeconds": "etaSeconds",
         "estimated_remaining_seconds": "etaSeconds", "estimatedRemainingSeconds": "etaSeconds"}
INTEGERS = ("step", "totalSteps", "etaSeconds")
FIELDS = ("percent", "step", "totalSteps", "epoch", "etaSeconds", "metrics", "time")
MAX_SUMMARY = 256
MAX_NUMBER = 1e15  # steps, epochs, seconds: so a label value (63 characters) always holds them

say = speaker("run")  # a part of `run`: its lines say "progress"


def _report_number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name}={str(value)[:40]!r}: a finite number is required")
    if abs(value) >= MAX_NUMBER:
        raise ValueError(f"{name}={str(value)[:40]}: a number below {MAX_NUMBER:.0e} is required")
    return float(value)


def _metric(metrics: Dict[str, float], name: object, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return
    if len(metrics) < MAX_METRICS and isinstance(name, str) and re.match(METRIC_NAME, name):
        metrics[name] = float(value)


def normalize(raw: object, time_text: str = "") -> Dict[str, object]:
    """A progress report as the notary records it: {"percent", "step", "totalSteps", "epoch", "etaSeconds",
    "metrics": {name: number}, "time"}, each only when known; ValueError naming the field otherwise.

    A training may write `step`, `total_steps` (or `totalSteps`), `epoch`, `percent`, `eta_seconds`, a `metrics`
    object, and any other top-level number, which is taken as a metric (`{"step": 5, "loss": 0.3}`). `percent` is
    computed from step and total when not given, and kept within 0-100. Metric names are short identifiers
    (METRIC_NAME), at most MAX_METRICS of them (the first, in the order written); anything else is left out."""
    if not isinstance(raw, dict):
        raise ValueError("a progress report is a JSON object, e.g. {\"step\": 10, \"total_steps\": 100, "
                         "\"loss\": 0.5}")
    out: Dict[str, object] = {}
    metrics: Dict[str, float] = {}
    given = raw.get("metrics")
    if given is not None and not isinstance(given, dict):
        raise ValueError("metrics: an object of names to numbers is required")
    for name, value in raw.items():
        field = KNOWN.get(name)
        if field is not None:
            number = _report_number(name, value)
            if number < 0:
                raise ValueError(f"{name}={value!r}: a number from 0 is required")
            out[field] = int(number) if field in INTEGERS else number
        elif name not in ("metrics", "time"):
            _metric(metrics, name, value)
    for name, value in (given or {}).items():
        _metric(metrics, name, value)
    if "totalSteps" in out and "step" in out and "percent" not in out and out["totalSteps"]:
        out["percent"] = 100.0 * float(out["step"]) / float(out["totalSteps"])  # type: ignore[arg-type]
    if "percent" in out:
        out["percent"] = round(min(100.0, max(0.0, float(out["percent"]))), 2)  # type: ignore[arg-type]
    if "epoch" in out:
        out["epoch"] = round(float(out["epoch"]), 4)  # type: ignore[arg-type]
    if metrics:
        out["metrics"] = {name: float(f"{value:.6g}") for name, value in metrics.items()}
    if not out:
        raise ValueError("the report has no step, percent, epoch or numeric metric")
    stamp = time_text or str(raw.get("time") or "")
    if stamp:
        out["time"] = stamp[:40]
    return {name: out[name] for name in FIELDS if name in out}


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


def summary(detail: Mapping[str, object]) -> str:
    """One human-readable line: `42% (step 420/1000, epoch 1.3), loss=0.512 lr=0.0001, about 5m10s left`."""
    parts = []
    if "step" in detail:
        parts.append(f"step {detail['step']}" + (f"/{detail['totalSteps']}" if "totalSteps" in detail else ""))
    if "epoch" in detail:
        parts.append(f"epoch {float(detail['epoch']):g}")  # type: ignore[arg-type]
    head = f"{float(detail['percent']):g}%" if "percent" in detail else ""  # type: ignore[arg-type]
    if parts:
        head = f"{head} ({', '.join(parts)})" if head else ", ".join(parts)
    metrics = detail.get("metrics") or {}
    text = ", ".join(p for p in (head, " ".join(f"{k}={v:g}" for k, v in metrics.items())) if p)  # type: ignore
    if "etaSeconds" in detail:
        text += f", about {_duration(float(detail['etaSeconds']))} left"  # type: ignore[arg-type]
    return text if len(text) <= MAX_SUMMARY else text[:MAX_SUMMARY - 3] + "..."


def label_value(detail: Mapping[str, object]) -> str:
    """What `kubectl get -L trainhook.dev/progress` shows (a label value: 63 characters of [A-Za-z0-9._-]):
    `42pct`, else `step-420`, else `epoch-1.5`, else "" (no label)."""
    if "percent" in detail:
        return f"{int(float(detail['percent']))}pct"  # type: ignore[arg-type]
    if "step" in detail:
        return f"step-{detail['step']}"
    if "epoch" in detail:
        return "epoch-" + f"{float(detail['epoch']):.2f}".rstrip("0").rstrip(".")  # type: ignore[arg-type]
    return ""


class ProgressFile:
    """The newest complete JSON line of a file someone appends to, read incrementally. A truncated or replaced
    file is read again from its start; a file that grew by more than MAX_READ bytes since the last look is read
    from its newest MAX_READ bytes (only the newest report counts)."""

    def __init__(self, path: str):
        self.path = path
        self.offset = 0
        self.inode: Optional[int] = None
        self.partial = b""
        self.problem = ""  # the last line that could not be read, said once

    def newest(self) -> Optional[dict]:
        """The newest valid object appended since the last call, or None."""
        try:
            with open(self.path, "rb") as f:
                st = os.fstat(f.fileno())
                if st.st_ino != self.inode or st.st_size < self.offset:
                    self.inode, self.offset, self.partial = st.st_ino, 0, b""
                if st.st_size - self.offset > MAX_READ:
                    self.offset, self.partial = st.st_size - MAX_READ, b""
                    f.seek(self.offset)
                    f.readline()  # the first line is probably cut
                    self.offset = f.tell()
                f.seek(self.offset)
                data = f.read(MAX_READ)
                self.offset = f.tell()
        except OSError:
            return None
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        if len(self.partial) > MAX_LINE:
            self.partial = b""
        for line in reversed(lines):
            if not line.strip() or len(line) > MAX_LINE:
                continue
            try:
                value = json.loads(line)
            except (ValueError, RecursionError) as e:
                self.problem = f"a line of the progress file {self.path} is not JSON: {e}"
                continue
            if isinstance(value, dict):
                return value
        return None


def eta(detail: Dict[str, object], first: Optional[tuple], now: float) -> Optional[tuple]:
    """Add etaSeconds to `detail` (unless the training gave it) from the rate since `first` = (time, step); returns
    the (time, step) to measure from next (the first report, or a new one when the step went back: a restart)."""
    step, total = detail.get("step"), detail.get("totalSteps")
    if not isinstance(step, int):
        return first
    if first is None or step < first[1]:
        return (now, step)
    if "etaSeconds" not in detail and isinstance(total, int) and total > step > first[1] and now > first[0]:
        detail["etaSeconds"] = int(max(0, total - step) * (now - first[0]) / (step - first[1]))
    return first


class Forwarder:
    """Rank 0's thread that watches the progress file and hands the newest report to `send` (the notary client's
    report_progress), at most once every `interval` seconds; `stop()` forwards the last one. A send that fails is
    said once per kind of failure and retried with the next report: progress never holds the training up."""

    def __init__(self, path: str, send: Callable[[dict], None], interval: float = DEFAULT_INTERVAL,
                 clock: Callable[[], float] = time.monotonic, stamp: Optional[Callable[[], str]] = None,
                 log: Callable[[str], None] = say, sleep: Callable[[float], None] = time.sleep):
        self.file = ProgressFile(path)
        self.send, self.interval, self.clock, self.log = send, max(MIN_INTERVAL, interval), clock, log
        self.sleep = sleep
        self.stamp = stamp or (lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        self.pending: Optional[dict] = None
        self.sent_at: Optional[float] = None
        self.first: Optional[tuple] = None
        self.said = ""
        self.forwarded = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True, name="progress")

    def start(self) -> Forwarder:
        self.thread.start()
        return self

    def look(self) -> None:
        """Read the file once and forward the newest report if the interval allows."""
        raw = self.file.newest()
        if raw is not None:
            try:
                detail = normalize(raw, self.stamp())
            except ValueError as e:
                self._say(f"a progress report in {self.file.path} was left out: {e}")
            else:
                self.first = eta(detail, self.first, self.clock())
                self.pending = detail
        if self.file.problem:
            self._say(self.file.problem)
            self.file.problem = ""
        if self.pending is not None and (self.sent_at is None or self.clock() - self.sent_at >= self.interval):
            self.flush()

    def flush(self) -> None:
        detail, self.pending = self.pending, None
        if detail is None:
            return
        self.sent_at = self.clock()
        try:
            self.send(detail)
            self.forwarded += 1
        except Exception as e:  # noqa: BLE001 - any failure to forward is said and never stops the training
            self._say(f"progress not forwarded: {e}")

    def _say(self, text: str) -> None:
        if text != self.said:
            self.log(text)
            self.said = text

    def _loop(self) -> None:
        while not self.stopping.wait(POLL):
            self.look()

    def stop(self) -> None:
        """Stop watching; forward what the training wrote last, once: at most MIN_INTERVAL seconds after the
        previous forward (the notary refuses two writes closer than that), whatever the interval."""
        if self.stopping.is_set():
            return
        self.stopping.set()
        if self.thread.is_alive():
            self.thread.join(POLL + 1)
        raw = self.file.newest()
        if raw is not None:
            try:
                self.pending = normalize(raw, self.stamp())
                self.first = eta(self.pending, self.first, self.clock())
            except ValueError:
                pass
        if self.pending is not None and self.sent_at is not None:
            wait = self.sent_at + MIN_INTERVAL - self.clock()
            if wait > 0:
                self.sleep(wait)
        self.flush()


def progress_file(env: Mapping[str, str]) -> str:
    """The file rank 0's training reports to: the container's own TRAINHOOK_PROGRESS_FILE if it set one, else a new
    file in a private temporary directory ("" when none can be made: then there is no progress to forward)."""
    given = env.get(keys.TH_PROGRESS_FILE, "").strip()
    if given:
        return given
    try:
        return os.path.join(files.private_directory("trainhook-progress-"), "progress.jsonl")
    except OSError:
        return ""


def interval_from(env: Mapping[str, str]) -> float:
    try:
        return max(MIN_INTERVAL, float(env.get(keys.TH_PROGRESS_INTERVAL, "") or DEFAULT_INTERVAL))
    except ValueError:
        say(f"{keys.TH_PROGRESS_INTERVAL}={env.get(keys.TH_PROGRESS_INTERVAL)!r} is not a number of seconds: using "
            f"{DEFAULT_INTERVAL:g}")
        return DEFAULT_INTERVAL


def watch(env: Dict[str, str], send: Callable[[dict], None]) -> Optional[Forwarder]:
    """Rank 0's forwarder, started: `env` (the training's environment) gets TRAINHOOK_PROGRESS_FILE."""
    path = progress_file(env)
    if not path:
        return None
    env[keys.TH_PROGRESS_FILE] = path
    return Forwarder(path, send, interval_from(env)).start()


def stop(forwarder: Optional[Forwarder]) -> None:
    """Stop `forwarder` (None: there is none), forwarding the training's last report."""
    if forwarder is not None:
        forwarder.stop()
