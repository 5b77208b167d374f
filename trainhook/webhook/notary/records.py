"""What the coordinator's record does to the cluster, pure: the outcome it posts (validated), the merge patch that
records it on each workload, and the Events that say so in `kubectl describe` (docs/operate/security.md, "What the
coordinator's record does").

Bodies come from pods, so every field is checked and bounded here before anything reaches the API server: a
phase of two values, integer codes, one-line reasons of bounded length, Event reasons as Kubernetes writes them.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re

from trainhook.gang import keys
from trainhook.webhook.notary.membership import Gang, WorkloadRef

SUCCEEDED, FAILED = "Succeeded", "Failed"
PHASES = (SUCCEEDED, FAILED)
MAX_REASON = 512  # the outcome's reason: one line, shown by kubectl
MAX_MESSAGE = 1024  # an Event's message (the API server truncates longer ones anyway)
# A finished gang's kept last lines (launcher/output_tail.py): at most two ranks (the deciding one and rank 0), each
# at most MAX_LINES lines and MAX_LINES_BYTES of UTF-8 (JSON escapes a tab or newline in two bytes), so the
# annotation stays within about 17 KiB of the 256 KiB Kubernetes allows a workload's annotations.
MAX_TAILS, MAX_LINES, MAX_LINES_BYTES = 2, 40, 4096
EVENT_REASON = re.compile(r"^[A-Z][A-Za-z0-9]{0,63}$")
EVENT_TYPES = ("Normal", "Warning")
COMPONENT = "trainhook-notary"
API_VERSIONS = {"StatefulSet": "apps/v1", "Job": "batch/v1", "Pod": "v1"}


class BadBody(Exception):
    """A request body the notary does not accept (HTTP 400); the message names the field and the fix."""


def _one_line(text: object, limit: int) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[:limit - 3] + "..."


def _integer(body: dict, name: str, default: int | None = None, low: int = 0) -> int:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value < 2 ** 31:
        raise BadBody(f"outcome.{name}={value!r}: an integer from {low} is required")
    return value


def parse_outcome(body: object) -> dict:
    """The outcome of a `POST /v1/outcome` body `{"outcome": OUTCOME}` (launcher.outcome.Outcome.to_dict(),
    plus `pod` when known), normalized; BadBody otherwise."""
    if not isinstance(body, dict) or not isinstance(body.get("outcome"), dict):
        raise BadBody('the body must be {"outcome": {"phase": ..., "code": ..., "reason": ..., "rank": ..., '
                      '"time": ...}}')
    raw = body["outcome"]
    phase = raw.get("phase")
    if phase not in PHASES:
        raise BadBody(f"outcome.phase={phase!r}: use {' or '.join(PHASES)}")
    time_text = str(raw.get("time") or "")
    try:
        dt.datetime.strptime(time_text, "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        raise BadBody(f"outcome.time={time_text!r}: RFC 3339 UTC required, e.g. 2024-01-02T03:04:05Z") from None
    outcome = {"phase": phase, "code": _integer(raw, "code"), "reason": _one_line(raw.get("reason", ""), MAX_REASON),
               "rank": _integer(raw, "rank", 0), "time": time_text, "attempt": _integer(raw, "attempt", 0),
               "restarts": _integer(raw, "restarts", 0)}
    if raw.get("pod"):
        outcome["pod"] = _one_line(raw["pod"], 253)
    if raw.get("started") is not None:
        started = str(raw["started"])
        try:
            dt.datetime.strptime(started, "%Y-%m-%dT%H:%M:%SZ")
        except ValueError:
            raise BadBody(f"outcome.started={started[:40]!r}: RFC 3339 UTC required, e.g. 2024-01-02T03:04:05Z") \
                from None
        outcome["started"] = started
    outcome["logs"] = parse_logs(raw.get("logs"), outcome["rank"])
    return outcome


def bounded_lines(text: str) -> str:
    """The last MAX_LINES lines of `text` that fit in MAX_LINES_BYTES (control characters shown as '?')."""
    lines = ["".join(c if c == "\t" or c >= " " and c != "\x7f" else "?" for c in line)
             for line in text.replace("\r", "").split("\n")[-MAX_LINES:]]
    kept: list[str] = []
    size = 0
    for line in reversed(lines):
        size += len(line.encode("utf-8")) + 1
        if size > MAX_LINES_BYTES:
            break
        kept.append(line)
    return "\n".join(reversed(kept))


def parse_logs(raw: object, deciding_rank: int) -> dict[int, str]:
    """`outcome.logs`, {"RANK": "last lines"}: the deciding rank's and rank 0's only, each bounded."""
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not all(isinstance(k, str) and k.isdigit() and isinstance(v, str)
                                            for k, v in raw.items()):
        raise BadBody('outcome.logs must be {"RANK": "the last lines", ...}')
    wanted = dict.fromkeys((deciding_rank, 0))
    return {int(k): bounded_lines(v) for k, v in raw.items() if int(k) in wanted and v}


def rank_pods(pods: list[dict], owners: set[str]) -> dict[int, str]:
    """rank -> pod name, from the TRAINHOOK_RANK the webhook wrote into each pod owned by one of the gang's
    workloads (uids in `owners`); a rank two pods claim is left out."""
    found: dict[int, list[str]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        if not any(ref.get("controller") and ref.get("uid") in owners for ref in meta.get("ownerReferences") or []):
            continue
        ranks = {str(item.get("value")) for container in (pod.get("spec") or {}).get("containers") or []
                 for item in container.get("env") or [] if item.get("name") == keys.TH_RANK}
        if len(ranks) == 1 and next(iter(ranks)).isdigit():
            found.setdefault(int(next(iter(ranks))), []).append(str(meta.get("name", "")))
    return {rank: names[0] for rank, names in found.items() if len(set(names)) == 1}


def parse_event(body: object) -> tuple[str, str, str]:
    """(type, reason, message) of a `POST /v1/event` body; BadBody otherwise."""
    if not isinstance(body, dict):
        raise BadBody('the body must be {"type": "Normal" or "Warning", "reason": "CamelCase", "message": "..."}')
    kind, reason = body.get("type"), body.get("reason")
    if kind not in EVENT_TYPES:
        raise BadBody(f"type={kind!r}: use Normal or Warning")
    if not isinstance(reason, str) or not EVENT_REASON.match(reason):
        raise BadBody(f"reason={reason!r}: one CamelCase word of at most 64 characters, e.g. GangRestarted")
    return kind, reason, _one_line(body.get("message", ""), MAX_MESSAGE)


def recorded_outcome(workload: dict | None) -> dict | None:
    """The outcome recorded on a workload's annotations, or None."""
    annotations = ((workload or {}).get("metadata") or {}).get("annotations") or {}
    phase = annotations.get(keys.PHASE)
    if phase not in PHASES:
        return None
    code = annotations.get(keys.EXIT_CODE, "")
    return {"phase": phase, "code": int(code) if code.isdigit() else (0 if phase == SUCCEEDED else 1),
            "reason": annotations.get(keys.PHASE_REASON, ""), "time": annotations.get(keys.PHASE_TIME, "")}


def same_record(recorded: dict, outcome: dict) -> bool:
    """Whether `outcome` is the one already recorded (a coordinator retrying its own record after an error)."""
    return all(recorded.get(k) == outcome.get(k) for k in ("phase", "code", "reason", "time"))


def record_patch(outcome: dict, resource_version: str | None = None) -> dict:
    """The merge patch recording `outcome` on a workload: the annotations the launcher always wrote, and the phase
    as a label too, so `kubectl get sts -L trainhook.dev/phase` and `-l trainhook.dev/phase=Failed` work. With
    `resource_version`, the API server applies it only to that version (first write wins, across replicas)."""
    annotations = {keys.PHASE: outcome["phase"], keys.PHASE_TIME: outcome["time"],
                   keys.PHASE_REASON: outcome["reason"], keys.EXIT_CODE: str(outcome["code"]),
                   keys.PHASE_RANK: str(outcome["rank"])}
    if outcome.get("attempt"):
        annotations[keys.ATTEMPTS] = str(outcome["attempt"])
    if outcome.get("pod"):
        annotations[keys.PHASE_POD] = outcome["pod"]
    if outcome.get("started"):
        annotations[keys.START_TIME] = outcome["started"]
    pods = outcome.get("pods") or {}
    logs = [{"rank": rank, "pod": pods.get(rank, ""), "lines": text}
            for rank, text in sorted((outcome.get("logs") or {}).items())[:MAX_TAILS]]
    if logs:
        annotations[keys.LAST_LINES] = json.dumps(logs, separators=(",", ":"), ensure_ascii=False)
    metadata: dict = {"annotations": annotations, "labels": {keys.PHASE: outcome["phase"]}}
    if resource_version:
        metadata["resourceVersion"] = resource_version
    return {"metadata": metadata}


def outcome_message(outcome: dict) -> tuple[str, str, str]:
    """(type, reason, message) of the Event an outcome emits."""
    if outcome["phase"] == SUCCEEDED:
        return "Normal", "GangSucceeded", _one_line(f"gang succeeded: {outcome['reason']}", MAX_MESSAGE)
    pod = f" (pod {outcome['pod']})" if outcome.get("pod") else ""
    return "Warning", "GangFailed", _one_line(f"gang failed: rank {outcome['rank']}{pod} exited "
                                              f"{outcome['code']}: {outcome['reason']}", MAX_MESSAGE)


def event(gang: Gang, workload: WorkloadRef, kind: str, reason: str, message: str, now: dt.datetime,
          key: str) -> dict:
    """A core/v1 Event on `workload`, named after `key` so that a retried record creates it once (409)."""
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    digest = hashlib.sha256(f"{gang.gang_id}/{workload.uid}/{key}".encode()).hexdigest()[:16]
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{workload.name}.{digest}", "namespace": gang.namespace,
                     "labels": {keys.JOB_NAME: gang.job}},
        "involvedObject": {"apiVersion": API_VERSIONS.get(workload.kind, "v1"), "kind": workload.kind,
                           "name": workload.name, "namespace": gang.namespace, "uid": workload.uid},
        "type": kind, "reason": reason, "message": message,
        "source": {"component": COMPONENT}, "reportingComponent": COMPONENT, "reportingInstance": COMPONENT,
        "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
    }
