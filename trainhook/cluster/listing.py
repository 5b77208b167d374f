"""`trainhook list`: the gangs as a table (kubectl's columns and habits), as JSON or YAML, and as a watch. Pure
functions on GangState (trainhook.cluster.status), with the time passed in, so every column is testable without a
cluster or a clock.

Columns: NAME, FRAMEWORK, SHAPE, PODS (running/size), RESTARTS, OUTCOME, PROGRESS (the training's last report: a
percentage, else its step, docs/use/progress.md), DURATION (from the gang's first start to its recorded end, or to
now while it runs) and AGE (since its first workload was created), with NAMESPACE first across namespaces (-A), and
`-o wide` adding WORKLOADS, METRICS (its last reported metrics) and DETAIL. `-o json|yaml` gives one object per gang
with every field, the times in RFC 3339.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Iterable

import yaml

from trainhook.cluster.status import GangState, table

OUTPUTS = ("table", "wide", "json", "yaml")


def parse_time(text: str) -> dt.datetime | None:
    try:
        return dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)
    except (TypeError, ValueError):
        return None


def human_duration(seconds: float) -> str:
    """kubectl's short form: 45s, 3m20s, 2h5m, 4d3h (two units at most)."""
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60}s" if seconds < 600 else f"{seconds // 60}m"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600}h"


def age(state: GangState, now: dt.datetime) -> str:
    created = parse_time(state.created)
    return human_duration((now - created).total_seconds()) if created else "-"


def duration(state: GangState, now: dt.datetime) -> str:
    """From the first start to the recorded end (a finished gang), or to now (a running one); "-" before it ran."""
    started = parse_time(state.started)
    if started is None:
        return "-"
    ended = parse_time(state.recorded.ended) if state.recorded else None
    if ended is None and state.finished:
        return "-"
    return human_duration(((ended or now) - started).total_seconds())


def progress_cell(state: GangState) -> str:
    report = state.progress or {}
    if isinstance(report.get("percent"), (int, float)):
        return f"{report['percent']:g}%"
    if isinstance(report.get("step"), int):
        return f"step {report['step']}" + (f"/{report['totalSteps']}" if isinstance(report.get("totalSteps"), int)
                                           else "")
    if isinstance(report.get("epoch"), (int, float)):
        return f"epoch {report['epoch']:g}"
    return "-"


def metrics_cell(state: GangState) -> str:
    metrics = (state.progress or {}).get("metrics")
    if not isinstance(metrics, dict) or not metrics:
        return "-"
    return ",".join(f"{k}={v:g}" for k, v in metrics.items() if isinstance(v, (int, float))) or "-"


def row(state: GangState, now: dt.datetime, all_namespaces: bool, wide: bool) -> tuple[str, ...]:
    cells = ((state.namespace,) if all_namespaces else ()) + (
        state.name, state.framework or "-", state.shape or "-",
        f"{sum(p.phase == 'Running' for p in state.pods)}/{state.size}", str(state.restarts), state.outcome,
        progress_cell(state), duration(state, now), age(state, now))
    if wide:
        cells += (",".join(state.workloads) or "-", metrics_cell(state), state.detail or "-")
    return cells


def header(all_namespaces: bool, wide: bool) -> tuple[str, ...]:
    cells = (("NAMESPACE",) if all_namespaces else ()) + (
        "NAME", "FRAMEWORK", "SHAPE", "PODS", "RESTARTS", "OUTCOME", "PROGRESS", "DURATION", "AGE")
    return cells + (("WORKLOADS", "METRICS", "DETAIL") if wide else ())


def as_dict(state: GangState, now: dt.datetime) -> dict:
    """One gang for -o json|yaml: every field `status` shows, machine-readable."""
    recorded = state.recorded
    return {
        "name": state.name, "namespace": state.namespace, "framework": state.framework, "shape": state.shape,
        "size": state.size, "running": sum(p.phase == "Running" for p in state.pods), "restarts": state.restarts,
        "outcome": state.outcome, "detail": state.detail, "workloads": list(state.workloads),
        "created": state.created or None, "started": state.started or None,
        "ended": (recorded.ended or None) if recorded else None,
        "durationSeconds": _seconds(state, now), "progress": state.progress,
        "pods": [{"name": p.name, "role": p.role, "rank": p.rank, "phase": p.phase, "ready": p.ready,
                  "restarts": p.restarts, "reason": p.reason, "node": p.node} for p in state.pods],
    }


def _seconds(state: GangState, now: dt.datetime) -> int | None:
    started = parse_time(state.started)
    ended = parse_time(state.recorded.ended) if state.recorded else None
    if started is None or (ended is None and state.finished):
        return None
    return max(0, int(((ended or now) - started).total_seconds()))


def format_gangs(states: list[GangState], output: str, now: dt.datetime, all_namespaces: bool = False) -> str:
    """The whole answer of one `trainhook list` in `output` (one of OUTPUTS)."""
    if output == "json":
        return json.dumps({"items": [as_dict(s, now) for s in states]}, indent=2)
    if output == "yaml":
        return yaml.safe_dump({"items": [as_dict(s, now) for s in states]}, sort_keys=False).rstrip()
    if not states:
        return "no gangs"
    wide = output == "wide"
    return table([header(all_namespaces, wide)] + [row(s, now, all_namespaces, wide) for s in states])


def watch(look: Callable[[], list[GangState]], emit: Callable[[str], None], output: str,
          now: Callable[[], dt.datetime], pause: Callable[[], bool], all_namespaces: bool = False) -> None:
    """`list --watch`: the table once, then a row for each gang whose row changed (a new gang, its pods, outcome,
    progress; AGE and DURATION alone do not count), as `kubectl get -w` does; with -o json|yaml, each changed gang
    as one document. Runs until `pause()` (which waits between looks) returns False."""
    wide = output == "wide"
    shown: dict[tuple[str, str], tuple] = {}
    first = True
    while True:
        states, moment = look(), now()
        changed = []
        for state in states:
            key = (state.namespace, state.name)
            # what the row says, but its clocks (DURATION, AGE): a change of these alone is not news
            seen = row(state, moment, False, False)[:-2] + (state.detail, metrics_cell(state))
            if shown.get(key) != seen:
                shown[key] = seen
                changed.append(state)
        if output in ("json", "yaml"):
            for state in changed:
                emit(json.dumps(as_dict(state, moment)) if output == "json"
                     else "---\n" + yaml.safe_dump(as_dict(state, moment), sort_keys=False).rstrip())
        elif first:
            emit(format_gangs(states, output, moment, all_namespaces))
        elif changed:
            widths = _widths(states, moment, all_namespaces, wide)
            for state in changed:
                emit(_aligned(row(state, moment, all_namespaces, wide), widths))
        first = False
        if not pause():
            return


def _widths(states: Iterable[GangState], now: dt.datetime, all_namespaces: bool, wide: bool) -> list[int]:
    rows = [header(all_namespaces, wide)] + [row(s, now, all_namespaces, wide) for s in states]
    return [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]


def _aligned(cells: tuple[str, ...], widths: list[int]) -> str:
    return "  ".join(cell.ljust(width) for cell, width in zip(cells, widths)).rstrip()
