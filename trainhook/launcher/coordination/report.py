"""What a member reports about itself and what the coordinator keeps of it: the data of the gang's wire.

Kept apart from the coordinator's decisions (coordinator.py) so that the member's side (gang_run.py) and the
decisions share one definition of a report, checked the same way wherever it is read.

Plain classes, not dataclasses: every gang pod's launcher start imports this module, and the dataclasses module
(with its `inspect`) was several ms of that start's CPU (issue 32).
"""

from __future__ import annotations

from trainhook.launcher.outcome import Outcome

# A member's status, as it reports it (and as the coordinator records it).
IDLE, RUNNING, EXITED, STOPPED, DONE = "idle", "running", "exited", "stopped", "done"
STATUSES = (IDLE, RUNNING, EXITED, STOPPED, DONE)
# An ended training's last lines (output_tail.TAIL_BYTES of UTF-8, which JSON may spell up to 6 times longer: well
# within the wire's 64 KiB line) and why it could not start, in words.
MAX_TAIL, MAX_CAUSE, MAX_SYMPTOM = 4096, 256, 32


class Report:
    """A member's account of itself: sent on joining and whenever it changes."""

    __slots__ = ("attempt", "status", "code", "restarts", "since", "outcome", "tail", "cause", "symptom")

    def __init__(self, attempt: int = 0, status: str = IDLE, code: int | None = None, restarts: int = 0,
                 since: float | None = None, outcome: dict | None = None, tail: str | None = None, cause: str = "",
                 symptom: str = ""):
        self.attempt, self.status, self.code, self.restarts = attempt, status, code, restarts
        self.since = since  # wall-clock time the gang's first attempt started, as this member knows it
        self.outcome = outcome
        self.tail = tail  # the last lines of this attempt's training, once it ended (output_tail)
        self.cause = cause  # why the training could not start (`command not found: torchrun`), once it ended
        # What its launcher recognized in the failure (failure_cause: `lost-peer`, `timeout`), for failure_rules.
        self.symptom = symptom

    def to_dict(self) -> dict:
        body = {"attempt": self.attempt, "status": self.status, "code": self.code, "restarts": self.restarts,
                "since": self.since, "outcome": self.outcome}
        if self.tail is not None:
            body["tail"] = self.tail
        if self.cause:
            body["cause"] = self.cause
        if self.symptom:
            body["symptom"] = self.symptom
        return body

    @classmethod
    def from_dict(cls, data: object) -> Report:
        """A report from the wire; ValueError for anything malformed (signed by a member, but still checked)."""
        if not isinstance(data, dict):
            raise ValueError("report is not an object")
        status = data.get("status")
        if status not in STATUSES:
            raise ValueError(f"unknown status {status!r}")
        attempt, restarts, code = data.get("attempt", 0), data.get("restarts", 0), data.get("code")
        since, outcome = data.get("since"), data.get("outcome")
        if not isinstance(attempt, int) or not isinstance(restarts, int) or attempt < 0 or restarts < 0:
            raise ValueError("attempt and restarts must be non-negative integers")
        if code is not None and not isinstance(code, int):
            raise ValueError("code must be an integer")
        if since is not None and not isinstance(since, (int, float)):
            raise ValueError("since must be a number")
        if outcome is not None:
            Outcome.from_dict(outcome)
        tail, cause = data.get("tail"), data.get("cause", "")
        if tail is not None and (not isinstance(tail, str) or len(tail.encode("utf-8", "replace")) > MAX_TAIL):
            raise ValueError(f"tail must be text of at most {MAX_TAIL} bytes")
        if not isinstance(cause, str) or len(cause) > MAX_CAUSE:
            raise ValueError(f"cause must be text of at most {MAX_CAUSE} characters")
        symptom = data.get("symptom", "")
        if not isinstance(symptom, str) or len(symptom) > MAX_SYMPTOM:
            raise ValueError(f"symptom must be text of at most {MAX_SYMPTOM} characters")
        return cls(attempt, status, code, restarts, since, outcome, tail, cause, symptom)


class Record:
    """What the coordinator knows of one member."""

    __slots__ = ("connection", "attempt", "status", "code", "acked", "told", "left")

    def __init__(self, connection: int = 0, attempt: int = 0, status: str = IDLE, code: int | None = None,
                 acked: bool = False, told: int = 0, left: bool = False):
        self.connection = connection  # the live connection's id; 0 when the member is not connected
        self.attempt, self.status, self.code = attempt, status, code
        self.acked = acked  # it acknowledged the outcome
        self.told = told  # the connection it was last told the outcome on
        self.left = left  # an elastic gang's member that said it is leaving (scaled down, or its pod deleted)

    @property
    def present(self) -> bool:
        """Connected and not leaving: a member the gang can count on now."""
        return bool(self.connection) and not self.left
