"""The gang's decisions, pure: rank 0's launcher decides here, for the whole gang, when to start, stop, restart
and end.

Why a module of its own: `CoordinatorState` is the coordinator's bookkeeping and rules with no socket and no thread:
events in (a member joined, reported, went away; time passed), messages out (`outbox`: (rank, body)), log lines
out (`log`) and Events for the notary out (`events`). coordinator.py carries them over the network; the tests
drive this module directly, with a clock of their own.

The rules (contract section 7):
- The first attempt starts when every member has joined (a barrier, so every member's failure is watched from
  the first second); members that do not join within the gang wait's timeout fail the gang, by name.
- The deciding member exiting 0 ends the gang: Succeeded (Kubeflow's rule: the chief or master; without one,
  TensorFlow's worker 0, since a parameter server serves until it is stopped; else rank 0). Any other member
  exiting 0 before it has finished its part and waits.
- A member exiting non-zero, or its launcher going away mid-run, fails the gang: every member is told at once
  (`done`), or, under restart-gang with a failure the failure rules retry (failure_rules.py: by default signals,
  lost peers and timeouts) and budget left, every running member is told to stop and the next attempt starts when
  all have stopped and are connected (a fresh rendezvous). The outcome's reason names the rule that decided.
- A failure fatal only by the default rule (exit 1-127) waits `settle` seconds for a member's death by signal:
  a member whose peer was killed often exits 1 first, and the killed one's failure is the gang's.
- The active deadline fails the gang (exit 124) however many attempts it took.
- A member that joins once the gang is done is told the outcome and never runs; one that joins after it
  finished its part of the current attempt (its container restarted) is told so and does not run it again.
- A coordinator that starts while members report an attempt already under way is a restarted rank 0: its
  training was lost, which is handled as rank 0 failing with 129. An outcome a member reports is never adopted
  (issue 22: a member, or whoever got hold of its pod, must not be able to end the gang with a made-up
  outcome); what a restarted coordinator knows comes from its own outcome marker or the notary's record, which
  gang_run reads (GET /v1/outcome) before the coordinator starts. Such a member counts as idle.
- A gang restart is also an Event on the gang's workloads (`events`, sent by the launcher through the notary,
  best effort: it never holds the gang up).
- An elastic gang (PyTorch `trainhook.dev/elastic: min:max`) changes size while it runs: elastic.py says how.

CoordinatorState is a plain class, not a dataclass: rank 0's launcher start imports this module, and the dataclasses
module (with its `inspect`) was several ms of that start's CPU (issue 32).
"""

from __future__ import annotations

from trainhook.launcher.coordination import elastic
from trainhook.gang.failure_rules import LOST_PEER, describe_code
from trainhook.launcher.pod_view import GangView
from trainhook.launcher.coordination.report import DONE, EXITED, IDLE, RUNNING, STOPPED, Record, Report
from trainhook.launcher.outcome import (EXIT_DEADLINE, EXIT_LOST, EXIT_NOT_ASSEMBLED, FAILED, SUCCEEDED, Outcome,
                                        now_rfc3339)
from trainhook.launcher.policy import ACTIVE_DEADLINE_SECONDS, RESTART_GANG, GangPolicy
from trainhook.launcher.reach import describe

ASSEMBLING, RUNNING_PHASE, RESTARTING, DONE_PHASE = "assembling", "running", "restarting", "done"


def deciding_rank(gang: GangView) -> int:
    """The member whose exit 0 ends the gang: the chief or master when the gang has one; else, for TensorFlow,
    worker 0 (a parameter server serves until it is stopped, so it never decides); else rank 0."""
    first: dict[str, int] = {}
    for peer in gang.peers:
        first.setdefault(peer.role, peer.rank)
    for role in ("chief", "master"):
        if role in first:
            return first[role]
    if gang.framework == "tensorflow" and "worker" in first:
        return first["worker"]
    return 0


class CoordinatorState:
    __slots__ = ("gang", "policy", "now", "phase", "attempt", "restarts", "since", "barrier_since", "outcome",
                 "records", "outbox", "log", "decider", "short_since", "events", "claims_refused", "tails",
                 "settling", "ready_cursor", "acked_cursor", "outcome_body")

    def __init__(self, gang: GangView, policy: GangPolicy, now: float):
        self.gang, self.policy = gang, policy
        self.now = now  # wall-clock time of creation (the first barrier starts here)
        self.phase, self.attempt, self.restarts = ASSEMBLING, 0, 0
        self.since: float | None = None
        self.barrier_since = now
        self.outcome: Outcome | None = None
        self.records = [Record() for _ in gang.peers]
        self.outbox: list[tuple[int, dict]] = []
        self.log: list[str] = []
        self.decider = deciding_rank(gang)
        self.short_since: float | None = None  # an elastic gang has had fewer than min members since
        self.events: list[tuple[str, str, str]] = []  # (type, reason, message) for the notary
        self.claims_refused: set = set()  # ranks whose claimed outcome was refused (logged once)
        self.tails: dict = {}  # rank -> the last lines of its latest ended training (the outcome's)
        self.settling: tuple | None = None  # (rank, code, reason, until): a failure fatal by default, waiting
        # Cursors that keep the barrier and the delivery check O(1) per event at 10,000 members (issue 32): the first
        # rank not yet known ready (_advance) and not yet known to have acknowledged the outcome (delivered).
        self.ready_cursor = 0
        self.acked_cursor = 0
        self.outcome_body: dict | None = None  # the `done` message, one object for every member (sent once per member)

    @property
    def elastic(self) -> bool:
        return self.gang.elastic is not None

    # --- events ---------------------------------------------------------------------------------------------
    def adopt(self, outcome: Outcome, source: str) -> None:
        """An outcome decided before this coordinator started: its own marker, or the notary's record (never a
        member's report: see _learn)."""
        if self.outcome is None:
            self.log.append(f"the gang is already done ({source}): {outcome.summary()}")
            self._finish(outcome, announce=False)

    def joined(self, rank: int, connection: int, report: Report) -> None:
        record = self.records[rank]
        if record.connection and record.connection != connection:
            self.log.append(f"{self.gang.peers[rank]} connected again: its previous launcher is gone")
            self.lost(rank, record.connection)
        record.connection, record.left = connection, False
        self._learn(rank, report)
        if self.outcome is not None:
            self._tell_outcome(rank)
            return
        current = self.phase == RUNNING_PHASE and record.attempt == self.attempt and report.attempt < self.attempt
        finished = current and record.status == EXITED and record.code == 0
        if finished:  # a restarted launcher of a member that already finished this attempt: it must not rerun it
            self.log.append(f"{self.gang.peers[rank]} rejoined; it finished its part of attempt {self.attempt} "
                            f"already and will not run it again")
        elif current and record.status == RUNNING and not self.elastic:
            record.status, record.code = report.status, report.code
            self._failure(rank, EXIT_LOST, f"{self.gang.peers[rank]} lost its training (its launcher restarted)",
                          LOST_PEER)
        elif current and record.status == RUNNING:
            record.status, record.code = IDLE, None  # its training is gone; elastic.joins_running starts it
        else:
            self._take(rank, report)
        self.outbox.append((rank, {"type": "welcome", "attempt": self.attempt, "phase": self.phase,
                                   "restarts": self.restarts, "since": self.since, "finished": finished}))
        if self.elastic and not finished:
            elastic.joins_running(self, rank, report)
        self._advance()

    def left(self, rank: int, connection: int, why: str) -> None:
        """An elastic gang's member says it is leaving (its launcher got SIGTERM: a scale-down or its pod
        deleted): not a failure, the others go on (torchrun's rendezvous); a fixed-size gang's leave is its
        loss, judged when its training's exit is reported."""
        if connection == self.records[rank].connection and self.elastic and self.outcome is None:
            elastic.leaves(self, rank, why)
            self._advance()

    def reported(self, rank: int, connection: int, report: Report) -> None:
        record = self.records[rank]
        if connection != record.connection:
            return  # a connection already replaced
        self._learn(rank, report)
        if self.outcome is not None:
            if report.status == DONE:
                record.acked = True
            else:
                self._tell_outcome(rank)
            return
        if record.left:
            return  # what its training does as it leaves (stopped by SIGTERM) is no news for the gang
        self._take(rank, report)
        self._advance()

    def lost(self, rank: int, connection: int) -> None:
        record = self.records[rank]
        if connection != record.connection:
            return
        record.connection = 0
        if self.elastic and self.outcome is None:
            elastic.lost(self, rank)
        elif self.outcome is None and self.phase == RUNNING_PHASE and record.attempt == self.attempt \
                and record.status == RUNNING:
            self._failure(rank, EXIT_LOST, f"{self.gang.peers[rank]}: its launcher went away (pod deleted or "
                                           f"evicted, container killed, or node lost)", LOST_PEER)
        self._advance()

    def tick(self, now: float) -> None:
        self.now = now
        if self.outcome is not None:
            return
        if self.settling is not None and now >= self.settling[3]:
            rank, code, reason, _ = self.settling
            self._finish(Outcome(FAILED, code, reason, rank, now_rfc3339(), self.attempt, self.restarts))
            return
        if self.policy.deadline and self.since is not None and now - self.since > self.policy.deadline:
            self._finish(Outcome(FAILED, EXIT_DEADLINE, f"DeadlineExceeded: the gang ran longer than "
                                 f"{ACTIVE_DEADLINE_SECONDS}={self.policy.deadline:g}s", 0, now_rfc3339(),
                                 self.attempt, self.restarts))
            return
        if self.elastic:
            short = elastic.tick(self, now)
            if short is not None:
                self._finish(short)
                return
        if self.phase in (ASSEMBLING, RESTARTING) and now - self.barrier_since > self.policy.join_timeout:
            missing = [self.gang.peers[r] for r, rec in enumerate(self.records)
                       if (not rec.connection or rec.status == RUNNING)
                       and (not self.elastic or r < self.gang.assembled_at)]
            verb = "join" if self.phase == ASSEMBLING else "come back for the restart"
            hint = ("; does every member's command run under `trainhook-launch run`?" if self.phase == ASSEMBLING
                    else "")
            self._finish(Outcome(FAILED, EXIT_NOT_ASSEMBLED, f"{len(missing)} member(s) did not {verb} within "
                                 f"{self.policy.join_timeout:g}s: {describe(missing)}{hint}", missing[0].rank
                                 if missing else 0, now_rfc3339(), self.attempt, self.restarts))

    # --- helpers ----------------------------------------------------------------------------------------------
    def delivered(self) -> bool:
        """Every member has acknowledged the outcome (of an elastic gang: every member that is here). An
        acknowledgement is never taken back, so a fixed-size gang's check resumes where the last one stopped."""
        if self.outcome is None:
            return False
        if self.elastic:
            return all(r.acked for r in self.records if r.present)
        while self.acked_cursor < len(self.records) and self.records[self.acked_cursor].acked:
            self.acked_cursor += 1
        return self.acked_cursor == len(self.records)

    def _learn(self, rank: int, report: Report) -> None:
        """Take what a member knows and this coordinator does not (after rank 0's launcher restarted)."""
        if report.tail is not None and self.outcome is None:
            self.tails[rank] = report.tail
        if report.outcome is not None and self.outcome is None:
            if rank not in self.claims_refused:
                self.claims_refused.add(rank)
                self.log.append(f"{self.gang.peers[rank]} reports that the gang is done "
                                f"({str(report.outcome.get('phase'))[:20]}): not adopted; only this coordinator's "
                                f"own observation or the notary's record decides the gang's outcome")
            return
        if self.since is None or (report.since is not None and report.since < self.since):
            self.since = report.since if report.since is not None else self.since
        self.restarts = max(self.restarts, report.restarts)
        if report.attempt > self.attempt and self.outcome is None:
            # The gang was under way before this coordinator: rank 0's launcher restarted and its training is
            # gone with it. Every member stops its training when it loses the coordinator.
            # (The members that joined before knew of no attempt, so they run nothing; this one's record is
            # taken from its report right after, which sends it a stop if it still runs.)
            self.attempt = report.attempt
            self.phase = RUNNING_PHASE
            self._failure(0, EXIT_LOST, f"{self.gang.peers[0]}: its launcher restarted during attempt "
                                        f"{self.attempt} (its container was restarted or its pod replaced)",
                          LOST_PEER)

    def _take(self, rank: int, report: Report) -> None:
        """A member's news. About another attempt than the current one, only whether it still runs something
        matters (the barrier waits for that; during a running attempt the start is already on its way)."""
        record = self.records[rank]
        if report.attempt != self.attempt:
            if self.phase != RUNNING_PHASE:
                record.status, record.code = (RUNNING if report.status == RUNNING else IDLE), None
                if report.status == RUNNING:
                    self.outbox.append((rank, {"type": "stop", "attempt": report.attempt,
                                               "why": "the gang is restarting"}))
            return
        before = (record.status, record.code)
        record.attempt, record.status, record.code = report.attempt, report.status, report.code
        if self.phase == RESTARTING and record.status == RUNNING and before[0] != RUNNING:
            self.outbox.append((rank, {"type": "stop", "attempt": self.attempt, "why": "the gang is restarting"}))
        if self.phase != RUNNING_PHASE or record.status not in (EXITED, STOPPED) or before == (record.status,
                                                                                                record.code):
            return
        peer = self.gang.peers[rank]
        if record.code == 0 and record.status == EXITED:
            if rank == self.decider and self.settling is None:
                self._finish(Outcome(SUCCEEDED, 0, f"{peer} exited 0", rank, now_rfc3339(), self.attempt,
                                     self.restarts))
            else:
                self.log.append(f"{peer} finished its part of attempt {self.attempt}; waiting for "
                                f"{self.gang.peers[self.decider]}")
        else:
            code = EXIT_LOST if record.code is None else record.code
            how = "exited with" if record.status == EXITED else "stopped with"
            self._failure(rank, code, f"{peer} {how} {describe_code(code)}"
                          + (f" ({report.cause})" if report.cause else ""), report.symptom)

    def _failure(self, rank: int, code: int, why: str, symptom: str = "") -> None:
        """A member failed: under restart-gang the failure rules decide whether the gang restarts (failure_rules),
        and the reason says which rule did; fail-gang retries nothing."""
        policy = self.policy
        if policy.on_failure != RESTART_GANG:
            self._finish(Outcome(FAILED, code, why, rank, now_rfc3339(), self.attempt, self.restarts))
            return
        decision = policy.rules.decide(code, symptom)
        if self.settling is not None:
            if code < 128 or not decision.restart:
                return  # the failure waiting to be final stands; this one is likely its consequence
            self.log.append(f"{why}: this is the gang's failure, not {self.gang.peers[self.settling[0]]}'s exit "
                            f"{self.settling[1]}")
            self.settling = None
        if not decision.restart:
            reason = f"{why}; {decision.words()} makes it fatal"
            if decision.rule.default and policy.settle > 0:
                self.settling = (rank, code, reason, self.now + policy.settle)
                self.log.append(f"{reason}: failing the gang in {policy.settle:g}s unless a member's death by a "
                                f"signal shows what caused it")
                return
            self._finish(Outcome(FAILED, code, reason, rank, now_rfc3339(), self.attempt, self.restarts))
            return
        why = f"{why}; {decision.words()} retries it"
        if self.restarts < policy.max_restarts:
            self.restarts += 1
            self.phase, self.barrier_since = RESTARTING, self.now
            self.log.append(f"{why}: restarting the gang (restart {self.restarts} of {policy.max_restarts}); "
                            f"stopping every member's training")
            self.events.append(("Warning", "GangRestarted", f"{why}: gang restart {self.restarts} of "
                                f"{policy.max_restarts} (attempt {self.attempt + 1} starts when every member "
                                f"has stopped)"))
            stop = {"type": "stop", "attempt": self.attempt, "why": why}
            for member, record in enumerate(self.records):
                if record.connection and record.status == RUNNING:
                    self.outbox.append((member, stop))
            return
        self._finish(Outcome(FAILED, code, f"{why}, but restart-gang's budget ({policy.max_restarts}) is spent",
                             rank, now_rfc3339(), self.attempt, self.restarts))

    def _finish(self, outcome: Outcome, announce: bool = True) -> None:
        self.outcome, self.phase, self.settling = outcome, DONE_PHASE, None
        self.outcome_body = None  # made from this outcome by the first _tell_outcome
        if announce:
            self.log.append(outcome.summary())
        for rank, record in enumerate(self.records):
            if record.connection:
                self._tell_outcome(rank)

    def _tell_outcome(self, rank: int) -> None:
        record = self.records[rank]
        if self.outcome is not None and record.connection and record.told != record.connection:
            record.told = record.connection
            if self.outcome_body is None:
                self.outcome_body = {"type": "done", "outcome": self.outcome.to_dict()}
            self.outbox.append((rank, self.outcome_body))

    def _advance(self) -> None:
        """The barrier: start the next attempt once every member is connected and none is still running."""
        if self.phase not in (ASSEMBLING, RESTARTING):
            return
        if not (elastic.ready(self) if self.elastic else self._all_ready()):
            return
        self.attempt += 1
        if self.since is None:
            self.since = self.now
        self.phase = RUNNING_PHASE
        starting = [rank for rank, r in enumerate(self.records) if r.present or not self.elastic]
        self.log.append(f"attempt {self.attempt}: " + (f"{len(starting)} members are here (elastic: at least "
                        f"{self.gang.assembled_at}, at most {self.gang.size})" if self.elastic else
                        f"all {len(self.records)} members are here") + "; starting the training"
                        + (f" (gang restart {self.restarts})" if self.restarts else ""))
        start = {"type": "start", "attempt": self.attempt, "restarts": self.restarts, "since": self.since}
        for rank in starting:  # one body for all: the coordinator makes its JSON once
            record = self.records[rank]
            record.attempt, record.status, record.code = self.attempt, RUNNING, None
            self.outbox.append((rank, start))

    def _all_ready(self) -> bool:
        """Every member connected and running nothing: the barrier's condition, in O(1) per event amortized.
        Called after each event, a scan of every member would make a gang's joins O(N^2) (10^8 checks at 10,000
        members). The cursor stays on the first member not ready; while it is still not ready nothing else is
        looked at, and it moves on only over ready members. Members behind it may have become unready since it
        passed them, so reaching the end is confirmed by one full scan, which restarts the cursor at the first
        unready member it finds. A scan that finds one follows a member becoming unready again (lost, or running
        again): O(N) for such a regression, O(1) amortized for every join, stop and report."""
        records = self.records
        while self.ready_cursor < len(records):
            record = records[self.ready_cursor]
            if not record.connection or record.status == RUNNING:
                return False
            self.ready_cursor += 1
        for rank, record in enumerate(records):
            if not record.connection or record.status == RUNNING:
                self.ready_cursor = rank
                return False
        self.ready_cursor = 0  # the barrier opens: the next one starts from the first member again
        return True
