"""Prometheus metrics and JSON logs for the webhook: what an operator needs to see it is healthy."""

from __future__ import annotations

import json
import logging
import time

from prometheus_client import CollectorRegistry, Counter, Histogram

from trainhook.webhook.admission.mutate import GATES


class Metrics:
    """One registry per app (no process-global state, so tests and apps never share counters)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.admissions = Counter("trainhook_admissions", "Admission reviews answered, by kind and outcome",
                                  ["kind", "outcome"], registry=self.registry)
        self.refusals = Counter("trainhook_refusals", "Problems named in denied reviews, by key",
                                ["reason"], registry=self.registry)
        self.bad_requests = Counter("trainhook_bad_requests", "Requests answered HTTP 400",
                                    registry=self.registry)
        self.latency = Histogram("trainhook_admission_seconds", "Time to answer a review, body read included",
                                 registry=self.registry,
                                 buckets=(.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5))
        self._admitted: dict[tuple[str, str], Counter] = {}

    def admitted(self, kind: str, outcome: str) -> None:
        """Count one answered review; the labeled counter is looked up once per (kind, outcome), as
        `labels()` takes a lock and builds a key on every call. A kind trainhook does not mutate counts as
        `other`: the kind comes from the request, and every new label value is a series kept forever."""
        if kind not in GATES:
            kind = "other"
        counter = self._admitted.get((kind, outcome))
        if counter is None:
            counter = self._admitted[kind, outcome] = self.admissions.labels(kind, outcome)
        counter.inc()


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and any `extra` fields given to the call."""

    RESERVED = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        entry = {"time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
                 + f".{int(record.msecs):03d}Z",
                 "level": record.levelname.lower(), "logger": record.name, "message": record.getMessage()}
        entry.update({k: v for k, v in record.__dict__.items() if k not in self.RESERVED})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_logging(level: str) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
