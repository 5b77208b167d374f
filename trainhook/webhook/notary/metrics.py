"""The gang metrics the notary exports, Prometheus-style (docs/operate/metrics.md is the reference: names, labels,
meaning), and its own request counts and latencies.

Why the notary: trainhook has no controller watching pods, but every gang's rank 0 talks to the notary when it
starts (its key), when the gang restarts (the GangRestarted Event), as it trains (progress) and when it ends (the
outcome record), each call authenticated as that pod. So the notary sees each gang's life without watching anything,
and these metrics cost the API server nothing.

What counts once: a gang is `gang_id` (namespace/job/uid of its anchor workload): a restarted rank 0 pod asking for
its key again does not start it twice, nor does a retried outcome record finish it twice. Each webhook replica counts
what reached it (sum over replicas in queries); the memory of which gangs it saw is bounded (MAX_GANGS, oldest
forgotten first) and lost with the process, so a gang started before a webhook restart is not "running" after it.
Label values are the gang's namespace and framework (from the webhook's own model, never free text from a pod);
the per-job progress gauges exist only while the gang runs.
"""

from __future__ import annotations

import collections
import datetime as dt
import time
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

MAX_GANGS = 10_000
START_BUCKETS = (1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600)
FINISH_BUCKETS = (10, 30, 60, 300, 600, 1800, 3600, 7200, 14400, 43200, 86400, 259200, 604800)
REQUEST_BUCKETS = (.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10)
CALLS = ("/v1/credential", "/v1/outcome", "/v1/event", "/v1/progress")


def parse_time(text: object) -> float | None:
    """Seconds since the epoch of an RFC 3339 UTC time as Kubernetes and the launcher write it, or None."""
    try:
        return dt.datetime.strptime(str(text), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc).timestamp()
    except ValueError:
        return None


@dataclass
class Seen:
    namespace: str
    framework: str
    job: str
    running: bool
    progress: bool = False
    finished: bool = False


class NotaryMetrics:
    """The notary's series, in `registry` (the webhook's own, so /metrics serves them beside admission's; a new one
    by default, so tests and apps never share counters)."""

    def __init__(self, registry: CollectorRegistry | None = None, clock=time.time):
        self.registry = CollectorRegistry() if registry is None else registry
        self.clock = clock
        r, gang = self.registry, ["namespace", "framework"]
        self.started = Counter("trainhook_gangs_started", "Gangs whose rank 0 launcher started (asked for the gang's "
                               "key for the first time)", gang, registry=r)
        self.succeeded = Counter("trainhook_gangs_succeeded", "Gangs whose outcome was recorded Succeeded", gang,
                                 registry=r)
        self.failed = Counter("trainhook_gangs_failed", "Gangs whose outcome was recorded Failed", gang, registry=r)
        self.restarted = Counter("trainhook_gangs_restarted", "Gang restarts (restart-gang), as rank 0 reported "
                                 "them", gang, registry=r)
        self.running = Gauge("trainhook_gangs_running", "Gangs started and not finished, as this replica saw them",
                             gang, registry=r)
        self.start_seconds = Histogram("trainhook_gang_start_seconds", "From the gang's workload's creation to its "
                                       "rank 0 launcher starting", ["framework"], buckets=START_BUCKETS, registry=r)
        self.finish_seconds = Histogram("trainhook_gang_duration_seconds", "From the gang's first attempt starting "
                                        "to its recorded outcome", ["framework", "phase"], buckets=FINISH_BUCKETS,
                                        registry=r)
        self.progress_percent = Gauge("trainhook_gang_progress_percent", "A running gang's progress as its training "
                                      "last reported it (0-100)", ["namespace", "job"], registry=r)
        self.requests = Counter("trainhook_notary_requests", "Notary requests answered, by call and HTTP status",
                                ["call", "code"], registry=r)
        self.request_seconds = Histogram("trainhook_notary_request_seconds", "Time to answer a notary request",
                                         ["call"], buckets=REQUEST_BUCKETS, registry=r)
        self.gangs: collections.OrderedDict[str, Seen] = collections.OrderedDict()

    def _remember(self, gang_id: str, seen: Seen) -> Seen:
        self.gangs[gang_id] = seen
        while len(self.gangs) > MAX_GANGS:
            _, old = self.gangs.popitem(last=False)
            self._leave(old)
        return seen

    def _leave(self, seen: Seen) -> None:
        if seen.running:
            self.running.labels(seen.namespace, seen.framework).dec()
            seen.running = False
        if seen.progress:
            try:
                self.progress_percent.remove(seen.namespace, seen.job)
            except KeyError:
                pass
            seen.progress = False

    # --- what the calls tell ----------------------------------------------------------------------------------
    def gang_started(self, gang_id: str, namespace: str, job: str, framework: str, created: object) -> None:
        """Rank 0 asked for its key and the gang has no outcome: a start, once per gang."""
        if gang_id in self.gangs:
            return
        self._remember(gang_id, Seen(namespace, framework, job, running=True))
        self.started.labels(namespace, framework).inc()
        self.running.labels(namespace, framework).inc()
        since = parse_time(created)
        if since is not None:
            self.start_seconds.labels(framework).observe(max(0.0, self.clock() - since))

    def gang_restarted(self, namespace: str, framework: str) -> None:
        self.restarted.labels(namespace, framework).inc()

    def gang_finished(self, gang_id: str, namespace: str, job: str, framework: str, outcome: dict) -> None:
        """An outcome was recorded (or found recorded): counted once per gang."""
        seen = self.gangs.get(gang_id) or self._remember(gang_id, Seen(namespace, framework, job, running=False))
        if seen.finished:
            return
        seen.finished = True
        phase = outcome.get("phase", "")
        (self.succeeded if phase == "Succeeded" else self.failed).labels(namespace, framework).inc()
        began, ended = parse_time(outcome.get("started")), parse_time(outcome.get("time"))
        if began is not None and ended is not None:
            self.finish_seconds.labels(framework, phase).observe(max(0.0, ended - began))
        self._leave(seen)

    def gang_progress(self, gang_id: str, namespace: str, job: str, framework: str, detail: dict) -> None:
        seen = self.gangs.get(gang_id) or self._remember(gang_id, Seen(namespace, framework, job, running=False))
        if seen.finished or "percent" not in detail:
            return
        self.progress_percent.labels(namespace, job).set(float(detail["percent"]))
        seen.progress = True

    def answered(self, call: str, code: int, seconds: float) -> None:
        call = call if call in CALLS else "other"
        self.requests.labels(call, str(code)).inc()
        self.request_seconds.labels(call).observe(seconds)
