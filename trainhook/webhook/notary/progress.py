"""A running gang's progress, recorded by the notary on its workload (docs/use/progress.md, issue 33).

Rank 0's launcher forwards what its training reports (launcher/progress.py) with `POST /v1/progress`
{"progress": {...}}, authenticated as rank 0 like the outcome record; only the gang's coordinator may. The notary
normalizes the report again with the launcher's own `normalize` (the body comes from a pod: every field checked
and bounded, numbers only, short metric names), writes it on the gang's anchor workload as a merge patch:
- annotation trainhook.dev/progress: one human-readable line (`42% (step 420/1000), loss=0.51, about 5m left`);
- annotation trainhook.dev/progress-detail: the report as JSON (what `trainhook status` and the SDK read);
- label trainhook.dev/progress: `42pct` (or `step-420`), for `kubectl get sts -L trainhook.dev/progress`;
and sets the gang's progress gauge (webhook/notary/metrics.py).

Bounded load: at most one write per gang every MIN_INTERVAL seconds whatever rank 0 sends (faster: HTTP 429 with
Retry-After; the launcher sends the newest report later), a body of at most a few KiB. A bare-Pod gang has no
workload to write on (the notary may not patch pods): its progress is exported only.
"""

from __future__ import annotations

import collections
import json
import time
from typing import TYPE_CHECKING
from collections.abc import Callable

from trainhook.gang import keys
from trainhook.launcher.progress import MIN_INTERVAL as LAUNCHER_INTERVAL
from trainhook.launcher.progress import label_value, normalize, summary
from trainhook.webhook.notary.membership import Refusal
from trainhook.webhook.notary.records import BadBody

if TYPE_CHECKING:
    from trainhook.webhook.notary.service import Notary, Verified

MIN_INTERVAL = LAUNCHER_INTERVAL - 1.0  # a little under the launcher's own floor: its clock is not ours
MAX_GATES = 10_000


def parse_progress(body: object) -> dict:
    """The report of a `POST /v1/progress` body, normalized; BadBody naming the field otherwise."""
    if not isinstance(body, dict) or not isinstance(body.get("progress"), dict):
        raise BadBody('the body must be {"progress": {"step": ..., "totalSteps": ..., "metrics": {...}, ...}}')
    raw = dict(body["progress"])
    time_text = str(raw.pop("time", "") or "")
    try:
        detail = normalize(raw)
    except ValueError as e:
        raise BadBody(f"progress: {e}") from None
    if time_text:
        detail["time"] = time_text[:40]
    return detail


def progress_patch(detail: dict) -> dict:
    """The merge patch writing `detail` on a workload (a label value of "" removes an earlier label)."""
    label = label_value(detail)
    return {"metadata": {
        "annotations": {keys.PROGRESS: summary(detail),
                        keys.PROGRESS_DETAIL: json.dumps(detail, separators=(",", ":"), sort_keys=True)},
        "labels": {keys.PROGRESS: label or None}}}


def recorded_progress(workload: dict | None) -> dict | None:
    """The progress recorded on a workload: the detail with its human-readable `summary`, or None."""
    annotations = ((workload or {}).get("metadata") or {}).get("annotations") or {}
    text = annotations.get(keys.PROGRESS_DETAIL)
    if not text:
        return None
    try:
        detail = json.loads(text)
    except (ValueError, RecursionError):  # anyone who may edit the workload wrote it
        return None
    if not isinstance(detail, dict):
        return None
    return {**detail, "summary": annotations.get(keys.PROGRESS, "")}


class Gate:
    """When each gang may next be written (bounded: the oldest gangs are forgotten first)."""

    def __init__(self, interval: float = MIN_INTERVAL, clock: Callable[[], float] = time.monotonic):
        self.interval, self.clock = interval, clock
        self.last: collections.OrderedDict[str, float] = collections.OrderedDict()

    def wait(self, gang_id: str) -> float:
        """Seconds until `gang_id` may be written again (0: now, and the write is counted)."""
        now = self.clock()
        last = self.last.get(gang_id)
        if last is not None and now - last < self.interval:
            return self.interval - (now - last)
        self.last[gang_id] = now
        self.last.move_to_end(gang_id)
        while len(self.last) > MAX_GATES:
            self.last.popitem(last=False)
        return 0.0


def post_progress(gate: Gate):
    """The notary's `POST /v1/progress` action (webhook/notary/routes.py routes it), writing each gang at most once
    per `gate.interval`: the gate is the route's own state, so the notary's core knows nothing of progress."""

    async def action(notary: Notary, verified: Verified, body: object) -> dict:
        detail = parse_progress(body)
        gang = verified.gang
        if not gang.coordinator:
            raise Refusal(403, f"pod {verified.place.namespace}/{verified.place.pod} is not the coordinator of gang "
                               f"{gang.namespace}/{gang.job} (rank 0's pod {gang.anchor_pod} is): only it may "
                               f"report the gang's progress")
        wait = gate.wait(gang.gang_id)
        if wait > 0:
            raise Refusal(429, f"progress of gang {gang.namespace}/{gang.job} was recorded less than "
                               f"{gate.interval:g} s ago: send the newest report in {wait:.0f} s")
        notary.metrics.gang_progress(gang.gang_id, gang.namespace, gang.job, verified.place.member.framework, detail)
        if gang.bare:
            return {"recorded": "", "progress": detail}
        ref = gang.anchor_workload
        await notary.authority.patch_workload(gang.namespace, ref.kind, ref.name, progress_patch(detail))
        return {"recorded": f"{ref.kind}/{ref.name}", "progress": detail}

    return action
