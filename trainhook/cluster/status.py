"""A gang's state from its objects, and how the CLI shows it: pure functions on plain dicts, no API calls.

The rank of a pod is the `TRAINHOOK_RANK` the webhook wrote into its training container; the outcome is the
`trainhook.dev/phase` the launchers record on the workload when the gang ends (with `phase-reason`,
`exit-code` and `phase-time`; read with the launcher's own `Outcome.from_annotations`, the reader paired with
the writer), else what the Jobs and the pods say (all pods Succeeded: Succeeded; any Failed: Failed).

A finished StatefulSet gang is scaled to zero, so its pods and their logs are gone: what it is inspected by then
is what the notary recorded with the outcome (`Recorded`: the deciding rank and its pod, the attempts, the start
and end times, and the last lines of the deciding rank and rank 0), and its shape is the one its pod template
keeps (`trainhook.dev/replicas`), not `worker=0`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from trainhook.gang import keys
from trainhook.gang.lookup import LABELS, setting
from trainhook.gang.shape import size_of
from trainhook.launcher.outcome import Outcome

TERMINAL = ("Succeeded", "Failed")


@dataclass(frozen=True)
class PodState:
    name: str
    role: str
    rank: int | None
    phase: str
    ready: str  # "1/1"
    restarts: int
    reason: str = ""  # a waiting/terminated reason (CrashLoopBackOff, Error, OOMKilled, Unschedulable, ...)
    node: str = ""


@dataclass(frozen=True)
class KeptLines:
    """The last lines of one rank's training, kept with the outcome (launcher/output_tail.py's bounds)."""

    rank: int
    pod: str
    lines: str


@dataclass(frozen=True)
class Recorded:
    """What the notary recorded on a workload when the gang ended (keys.OUTCOME_ANNOTATIONS)."""

    phase: str
    code: int
    reason: str
    ended: str
    rank: int | None = None
    pod: str = ""
    attempts: int | None = None
    started: str = ""
    kept: tuple[KeptLines, ...] = ()


@dataclass
class GangState:
    name: str
    namespace: str
    framework: str = ""
    shape: str = ""  # role=count,... in rank order
    size: int = 0
    workloads: list[str] = field(default_factory=list)  # kind/name
    pods: list[PodState] = field(default_factory=list)
    outcome: str = "NotFound"  # Pending, Starting, Running, Succeeded, Failed, NotFound
    detail: str = ""  # the phase annotation's text, or why the gang failed
    recorded: Recorded | None = None  # what the notary recorded with the outcome (None: nothing, or no notary)
    progress: dict | None = None  # the training's last report as the notary recorded it (docs/use/progress.md)
    created: str = ""  # the earliest creationTimestamp of its workloads (else pods), RFC 3339
    started: str = ""  # when its first attempt started (recorded), else when its first pod started

    @property
    def finished(self) -> bool:
        return self.outcome in TERMINAL

    @property
    def restarts(self) -> int:
        return sum(pod.restarts for pod in self.pods)


def training_container_name(pod: dict) -> str:
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    wanted = ((pod.get("metadata") or {}).get("annotations") or {}).get(keys.CONTAINER)
    names = [str(c.get("name", "")) for c in containers]
    return str(wanted) if wanted in names else names[0]


def container_started(pod: dict, container: str) -> bool:
    """Whether the container has run (so it has a log): running or terminated, now or before."""
    status = pod.get("status") or {}
    for item in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        if item.get("name") == container:
            state, last = item.get("state") or {}, item.get("lastState") or {}
            return bool(state.get("running") or state.get("terminated") or last.get("terminated"))
    return False


def pod_rank(pod: dict) -> int | None:
    """TRAINHOOK_RANK from the pod's training container (set by the webhook at admission)."""
    wanted = training_container_name(pod)
    for container in (pod.get("spec") or {}).get("containers") or []:
        if container.get("name") != wanted:
            continue
        for item in container.get("env") or []:
            if item.get("name") == keys.TH_RANK and str(item.get("value", "")).isdigit():
                return int(item["value"])
    return None


def pod_state(pod: dict) -> PodState:
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    statuses = status.get("containerStatuses") or []
    total = len((pod.get("spec") or {}).get("containers") or [])
    ready = sum(1 for s in statuses if s.get("ready"))
    reason = ""
    for s in (status.get("initContainerStatuses") or []) + statuses:
        state = s.get("state") or {}
        detail = (state.get("waiting") or {}).get("reason") or (state.get("terminated") or {}).get("reason")
        if detail and detail not in ("Completed", "PodInitializing"):
            reason = detail
            break
    if not reason:
        for condition in status.get("conditions") or []:
            if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
                reason = condition.get("reason") or "Unschedulable"
    if meta.get("deletionTimestamp"):
        reason = "Terminating"
    return PodState(name=meta.get("name", ""), role=(meta.get("labels") or {}).get(keys.ROLE, ""),
                    rank=pod_rank(pod), phase=status.get("phase") or "Pending", ready=f"{ready}/{total}",
                    restarts=sum(int(s.get("restartCount") or 0) for s in statuses), reason=reason,
                    node=(pod.get("spec") or {}).get("nodeName") or "")


def workload_size(workload: dict) -> int:
    spec = workload.get("spec") or {}
    value = spec.get("replicas", 1) if workload.get("kind") == "StatefulSet" else spec.get("completions", 1)
    return int(value or 0)


def job_condition(workload: dict) -> str:
    for condition in (workload.get("status") or {}).get("conditions") or []:
        if condition.get("status") == "True" and condition.get("type") in ("Complete", "Failed"):
            return "Succeeded" if condition["type"] == "Complete" else "Failed"
    return ""


def template_shape(workload: dict) -> str:
    """The shape the webhook stamped on the pod template (`trainhook.dev/replicas`), or the workload's own (the one
    lookup, trainhook/gang/lookup.py); "" when neither is a shape with members."""
    text = setting(workload, keys.REPLICAS) or ""
    return text if size_of(text) else ""


def gang_shape(workloads: list[dict], pods: list[dict]) -> tuple[str, int]:
    """The shape from the workloads' annotation (multi-role) or their replica counts; else from the pods. A
    workload scaled to zero (a finished StatefulSet gang) counts as the shape its template keeps, so a finished gang
    never shows `worker=0`."""
    for workload in workloads:
        text = template_shape(workload)
        if "," in text:
            return text, size_of(text)
    if workloads:
        counts = []
        for w in workloads:
            role = setting(w, keys.ROLE, LABELS) or "worker"
            size = workload_size(w)
            if size == 0 and template_shape(w):
                size = size_of(template_shape(w))
            counts.append((role, size))
        return ",".join(f"{role}={count}" for role, count in counts), sum(count for _, count in counts)
    for pod in pods:
        for container in (pod.get("spec") or {}).get("containers") or []:
            for item in container.get("env") or []:
                if item.get("name") == keys.TH_REPLICAS:
                    text = str(item.get("value", ""))
                    return text, size_of(text)
    return "", len(pods)


def recorded_outcome(workload: dict) -> tuple[str, str] | None:
    """(phase, detail) the launchers recorded on a workload, read by the launcher's own reader (the one a launcher
    asks before it reruns anything), so status agrees with the launchers on whether a gang is done:
    `rank 2 (worker-2 at g-2.g) exited with 3 (exit 3) at 2025-01-01T00:00:00Z`. None when there is no outcome."""
    recorded = Outcome.from_annotations((workload.get("metadata") or {}).get("annotations") or {})
    if recorded is None:
        return None
    detail = f"{recorded.reason} (exit {recorded.code})" + (f" at {recorded.time}" if recorded.time else "")
    return recorded.phase, detail.strip()


def recorded_details(workload: dict) -> Recorded | None:
    """Everything the notary recorded with the outcome on one workload; None without an outcome. Values that do not
    parse are left out, never guessed."""
    found = recorded_outcome(workload)
    if found is None:
        return None
    annotations = (workload.get("metadata") or {}).get("annotations") or {}
    base = Outcome.from_annotations(annotations)
    assert base is not None
    rank, attempts = annotations.get(keys.PHASE_RANK, ""), annotations.get(keys.ATTEMPTS, "")
    return Recorded(phase=base.phase, code=base.code, reason=base.reason, ended=base.time,
                    rank=int(rank) if rank.isdigit() else None, pod=annotations.get(keys.PHASE_POD, ""),
                    attempts=int(attempts) if attempts.isdigit() else None,
                    started=annotations.get(keys.START_TIME, ""), kept=kept_lines(annotations.get(keys.LAST_LINES)))


def kept_lines(text: str | None) -> tuple[KeptLines, ...]:
    """The `trainhook.dev/last-lines` annotation: JSON [{"rank", "pod", "lines"}]; () when absent or unreadable."""
    try:
        entries = json.loads(text or "[]")
    except ValueError:
        return ()
    kept = []
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and isinstance(entry.get("rank"), int) and isinstance(entry.get("lines"), str):
            kept.append(KeptLines(entry["rank"], str(entry.get("pod") or ""), entry["lines"]))
    return tuple(kept)


def gang_record(workloads: list[dict]) -> Recorded | None:
    """The record that decides the gang's outcome (a Failed one first, as `outcome` reads them)."""
    records = [found for found in map(recorded_details, workloads) if found]
    return next((r for r in records if r.phase == "Failed"), records[0] if records else None)


def outcome(workloads: list[dict], pods: list[PodState], size: int) -> tuple[str, str]:
    """(outcome, detail): the launchers' recorded phase wins, then the Jobs' conditions, then the pods."""
    phases = [found for found in map(recorded_outcome, workloads) if found]
    for wanted in ("Failed", "Succeeded"):
        for phase, detail in phases:
            if phase == wanted:
                return phase, detail
    conditions = [job_condition(w) for w in workloads if w.get("kind") == "Job"]
    if conditions and "Failed" in conditions:
        return "Failed", "a Job of the gang failed"
    if conditions and all(c == "Succeeded" for c in conditions) and len(conditions) == len(workloads):
        return "Succeeded", "every Job completed"
    if not workloads and not pods:
        return "NotFound", ""
    failed = [p for p in pods if p.phase == "Failed"]
    if failed:
        return "Failed", ", ".join(f"{p.name} {p.reason or 'failed'}" for p in failed)
    if pods and len(pods) >= size and all(p.phase == "Succeeded" for p in pods):
        return "Succeeded", "every pod succeeded"
    running = [p for p in pods if p.phase in ("Running", "Succeeded")]
    if pods and len(running) >= size:
        return "Running", ""
    if running:
        return "Starting", f"{len(running)}/{size} pods running"
    return "Pending", f"{len(pods)}/{size} pods created"


def gang_progress(workloads: list[dict]) -> dict | None:
    """The newest progress recorded on the gang's workloads (keys.PROGRESS_DETAIL, with the human-readable
    keys.PROGRESS line as `summary`); None when the training reported none. Unreadable values are left out."""
    found = []
    for workload in workloads:
        annotations = (workload.get("metadata") or {}).get("annotations") or {}
        try:
            detail = json.loads(annotations.get(keys.PROGRESS_DETAIL) or "null")
        except ValueError:
            continue
        if isinstance(detail, dict):
            found.append({**detail, "summary": str(annotations.get(keys.PROGRESS) or "")})
    return max(found, key=lambda d: str(d.get("time") or ""), default=None)


def _earliest(objects: list[dict], read) -> str:
    return min((str(v) for v in map(read, objects) if v), default="")


def gang_state(name: str, namespace: str, workloads: list[dict], pods: list[dict]) -> GangState:
    states = sorted((pod_state(p) for p in pods),
                    key=lambda p: (p.rank is None, p.rank if p.rank is not None else 0, p.name))
    shape, size = gang_shape(workloads, pods)
    found = [setting(w, keys.FRAMEWORK, LABELS) for w in workloads]
    found += [((p.get("metadata") or {}).get("labels") or {}).get(keys.FRAMEWORK) for p in pods]
    framework = next((f for f in found if f), "")
    result, detail = outcome(workloads, states, size)
    recorded = gang_record(workloads)
    created = _earliest(workloads or pods, lambda o: (o.get("metadata") or {}).get("creationTimestamp"))
    started = (recorded.started if recorded else "") or _earliest(pods, lambda p: (p.get("status") or {})
                                                                  .get("startTime"))
    return GangState(name=name, namespace=namespace, framework=framework, shape=shape, size=size,
                     workloads=[f"{w.get('kind', '').lower()}/{w['metadata']['name']}" for w in workloads],
                     pods=states, outcome=result, detail=detail, recorded=recorded,
                     progress=gang_progress(workloads), created=created, started=started)


def table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows)


def format_status(state: GangState) -> str:
    """The gang's headline and one row per pod, in rank order."""
    if state.outcome == "NotFound":
        return f"gang {state.name} not found in namespace {state.namespace}"
    head = f"gang {state.name} ({state.framework or '?'}, {state.shape or '?'}) in {state.namespace}: {state.outcome}"
    if state.detail:
        head += f" ({state.detail})"
    rows = [("POD", "ROLE", "RANK", "PHASE", "READY", "RESTARTS", "REASON")]
    rows += [(p.name, p.role or "-", "-" if p.rank is None else str(p.rank), p.phase, p.ready, str(p.restarts),
              p.reason or "-") for p in state.pods]
    lines = [head, f"workloads: {', '.join(state.workloads) or '-'}"]
    lines += format_progress(state.progress)
    if state.recorded is not None:
        lines += format_recorded(state.recorded)
    if state.pods:
        lines.append(table(rows))
    elif state.finished:
        kept = state.recorded.kept if state.recorded else ()
        lines.append("no pods: the gang is finished (a StatefulSet gang is scaled to zero, which deletes its pods and "
                     "their logs)" + (f"; `trainhook logs {state.name}` prints the kept last lines of "
                                      f"{' and '.join(f'rank {k.rank}' for k in kept)}" if kept else ""))
    else:
        lines.append("no pods yet")
    return "\n".join(lines)


def format_progress(progress: dict | None) -> list[str]:
    """The training's last report: `progress: 42% (step 420/1000), ... (reported T)` and its metrics, one line."""
    if not progress:
        return []
    line = f"progress: {progress.get('summary') or '-'}" + (f" (reported {progress['time']})"
                                                           if progress.get("time") else "")
    metrics = progress.get("metrics")
    metrics = metrics if isinstance(metrics, dict) else {}
    shown = " ".join(f"{k}={v:g}" for k, v in metrics.items() if isinstance(v, (int, float)))
    return [line] + ([f"last metrics: {shown}"] if shown else [])


def format_recorded(recorded: Recorded) -> list[str]:
    """The outcome as the notary recorded it, one fact a line: who, what, how many attempts, when."""
    who = "-" if recorded.rank is None else f"rank {recorded.rank}"
    if recorded.pod:
        who += f" (pod {recorded.pod})"
    lines = [f"outcome: {recorded.phase}, exit code {recorded.code}, decided by {who}"
             + (f", attempt {recorded.attempts}" if recorded.attempts else ""),
             f"reason: {recorded.reason or '-'}",
             f"started: {recorded.started or '-'}  ended: {recorded.ended or '-'}"]
    if recorded.kept:
        lines.append("kept last lines: " + ", ".join(f"rank {k.rank}" + (f" ({k.pod})" if k.pod else "")
                                                     + f", {len(k.lines.splitlines())} lines" for k in recorded.kept))
    return lines


def format_list(states: list[GangState]) -> str:
    if not states:
        return "no gangs"
    rows = [("NAME", "FRAMEWORK", "SHAPE", "PODS", "RESTARTS", "OUTCOME")]
    rows += [(s.name, s.framework or "-", s.shape or "-", f"{sum(p.phase == 'Running' for p in s.pods)}/{s.size}",
              str(s.restarts), s.outcome) for s in states]
    return table(rows)


def progress(state: GangState) -> str:
    """One line for `submit --wait`: the outcome and how many pods are in each phase."""
    counts: dict[str, int] = {}
    for pod in state.pods:
        counts[pod.phase] = counts.get(pod.phase, 0) + 1
    phases = ", ".join(f"{count} {phase}" for phase, count in sorted(counts.items())) or "no pods"
    line = f"gang {state.name}: {state.outcome} ({phases}; {state.restarts} restarts)"
    return f"{line}: {state.detail}" if state.detail and state.finished else line


def changes(before: GangState | None, after: GangState) -> list[str]:
    """Lines for what changed between two looks at a gang: each pod's phase or restarts, then the gang."""
    lines = []
    old = {p.name: p for p in before.pods} if before else {}
    for pod in after.pods:
        previous = old.get(pod.name)
        if previous is None or (previous.phase, previous.restarts, previous.reason) != \
                (pod.phase, pod.restarts, pod.reason):
            what = pod.phase + (f" ({pod.reason})" if pod.reason else "")
            if pod.restarts:
                what += f", {pod.restarts} restarts"
            lines.append(f"  pod {pod.name} (rank {'-' if pod.rank is None else pod.rank}): {what}")
    if before is None or lines or progress(before) != progress(after):
        lines.append(progress(after))
    return lines
