"""How a gang ended, as data: the Outcome record, its phases and the gang's own exit codes (contract section 7).

Why a module of its own: the outcome is what every part of the launcher passes around (the coordinator decides
it, members end by it, the notary records it, gang_report carries it, `trainhook status` reads it back from a
workload's annotations), while the policy and settings that lead to it (policy.py) concern one launcher only.
Everything here is pure and standard library only. Outcome is a plain class, not a dataclass: every gang pod's
launcher start imports this module, and the dataclasses module (with its `inspect`) was several ms of that start's
CPU (issue 32).
"""

from __future__ import annotations

import time

from trainhook.gang import keys

TYPE_CHECKING = False  # typing's own, without importing typing (trainhook/launcher/__init__.py says why)
if TYPE_CHECKING:
    from typing import Mapping

PHASE, PHASE_TIME, PHASE_REASON, EXIT_CODE = keys.PHASE, keys.PHASE_TIME, keys.PHASE_REASON, keys.EXIT_CODE
SUCCEEDED, FAILED = "Succeeded", "Failed"

# Exit codes of the gang itself (a member's own codes pass through).
EXIT_LOST = 129  # a member's launcher went away mid-run (pod deleted, evicted, node lost): retryable
EXIT_DEADLINE = 124  # active-deadline-seconds passed: permanent, as timeout(1) reports it
EXIT_NOT_ASSEMBLED = 1  # members did not join (or come back) in time


class Outcome:
    """How the gang ended. `rank` is the member that decided it (rank 0 for success, the failing member else). A
    value: equal to an Outcome of the same fields, and never changed once made."""

    __slots__ = ("phase", "code", "reason", "rank", "time", "attempt", "restarts")

    def __init__(self, phase: str, code: int, reason: str, rank: int, time: str, attempt: int = 0, restarts: int = 0):
        self.phase = phase  # SUCCEEDED or FAILED
        self.code, self.reason, self.rank = code, reason, rank
        self.time = time  # RFC 3339 UTC
        self.attempt, self.restarts = attempt, restarts

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Outcome) and self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash(tuple(self.to_dict().values()))

    def __repr__(self) -> str:
        return "Outcome(" + ", ".join(f"{name}={value!r}" for name, value in self.to_dict().items()) + ")"

    @property
    def succeeded(self) -> bool:
        return self.phase == SUCCEEDED

    def to_dict(self) -> dict:
        return {"phase": self.phase, "code": self.code, "reason": self.reason, "rank": self.rank, "time": self.time,
                "attempt": self.attempt, "restarts": self.restarts}

    @classmethod
    def from_dict(cls, data: Mapping) -> Outcome:
        """Rebuild an outcome received from a peer or read from a marker; ValueError when it is not one."""
        try:
            phase, code = str(data["phase"]), int(data["code"])
            if phase not in (SUCCEEDED, FAILED):
                raise ValueError(f"phase {phase!r}")
            return cls(phase, code, str(data.get("reason", "")), int(data.get("rank", 0)),
                       str(data.get("time", "")), int(data.get("attempt", 0)), int(data.get("restarts", 0)))
        except (KeyError, TypeError) as e:
            raise ValueError(f"not an outcome: {e}") from e

    def annotations(self) -> dict[str, str]:
        """What the launcher records on the workload."""
        return {PHASE: self.phase, PHASE_TIME: self.time, PHASE_REASON: self.reason, EXIT_CODE: str(self.code)}

    @classmethod
    def from_annotations(cls, annotations: Mapping[str, str]) -> Outcome | None:
        """The outcome recorded on a workload, or None when it carries none (or one we cannot read)."""
        phase = annotations.get(PHASE, "")
        if phase not in (SUCCEEDED, FAILED):
            return None
        code_text = annotations.get(EXIT_CODE, "")
        code = int(code_text) if code_text.isdigit() else (0 if phase == SUCCEEDED else 1)
        return cls(phase, code, annotations.get(PHASE_REASON, ""), 0, annotations.get(PHASE_TIME, ""))

    def summary(self) -> str:
        restarts = f" after {self.restarts} gang restart{'s' if self.restarts != 1 else ''}" if self.restarts else ""
        return f"gang {self.phase.lower()}{restarts}: {self.reason} (exit {self.code})"


def now_rfc3339(when: float | None = None) -> str:
    """`when` (seconds since the epoch; now by default) in RFC 3339 UTC, to the second. With `time`, not
    `datetime`, whose import was ~0.5 ms of every launcher's start (issue 32)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))
