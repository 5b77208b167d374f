"""The coordinator's rules for an elastic gang (PyTorch `trainhook.dev/elastic: min:max`, c10d rendezvous).

A fixed-size gang is all or nothing: every member must be there to start, and a member that goes away is a
failure. An elastic gang's size changes while it trains (`kubectl scale`, an HPA), and torchrun's c10d
rendezvous re-forms the training at each change, so the coordinator (coordinator_rules.CoordinatorState, whose state
these functions read and change; all pure) holds it to these rules instead:

- it starts once `min` members are here (the gang wait waits for those, wait.elastic_wait_view), not `max`;
- a member that joins while an attempt runs (a scale-up, or a pod the StatefulSet controller replaced) starts
  its training at once, in that attempt: torchrun's rendezvous lets it in at its next round;
- a member that leaves (its launcher got SIGTERM: a scale-down deleted its pod, or the pod was deleted or
  evicted to be replaced) said so first (`leave`), and its going is not a failure: the others go on, torchrun
  re-forms the rendezvous without it; a launcher that vanishes without a word (node lost, container killed) is
  treated the same, since torchrun's agents on the other members recover from it in the same way;
- a training that exits non-zero is still a failure, judged by the gang's policy as for any gang: torchrun has
  then spent its own restarts (PET_MAX_RESTARTS), so the gang's on-failure decides;
- fewer than `min` members for longer than the wait timeout fails the gang, saying so, instead of a silent
  wait in torchrun's rendezvous.
Rank 0 stays special: its launcher is the coordinator and its torchrun hosts the c10d store, so it never leaves
quietly; a scale-down never removes it (min is at least 1), and its pod's loss is rank 0's failure.
"""

from __future__ import annotations

from trainhook.launcher.pod_view import GangView
from trainhook.launcher.coordination.report import IDLE, RUNNING, Record, Report
from trainhook.launcher.outcome import EXIT_NOT_ASSEMBLED, FAILED, Outcome, now_rfc3339
from trainhook.launcher.policy import GangPolicy

TYPE_CHECKING = False  # typing's own, without importing typing (trainhook/launcher/__init__.py says why)
if TYPE_CHECKING:  # the state's shape, for the type checker alone
    from typing import List, Optional, Protocol, Tuple

    class ElasticState(Protocol):
        """What these rules read and change of the coordinator's state (coordinator_rules.CoordinatorState): declared
        here, so this module never imports the coordinator, which imports it (tests/launcher/test_launcher_imports.py:
        no cycle)."""

        gang: GangView
        policy: GangPolicy
        phase: str
        attempt: int
        restarts: int
        since: Optional[float]
        short_since: Optional[float]
        records: List[Record]
        outbox: List[Tuple[int, dict]]
        log: List[str]


def present(state: ElasticState) -> list[int]:
    """The ranks of the members the gang has now: connected, and not leaving."""
    return [rank for rank, record in enumerate(state.records) if record.present]


def ready(state: ElasticState) -> bool:
    """The barrier of an elastic gang: at least `min` members here, and none of them still running an older
    attempt's training (after a gang restart)."""
    here = present(state)
    return len(here) >= state.gang.assembled_at and all(state.records[r].status != RUNNING for r in here)


def joins_running(state: ElasticState, rank: int, report: Report) -> None:
    """A member that joins while an attempt runs starts it at once (torchrun lets it in at the next round)."""
    record = state.records[rank]
    if state.phase != "running" or record.status == RUNNING or report.status == RUNNING:
        return
    record.attempt, record.status, record.code = state.attempt, RUNNING, None
    state.log.append(f"{state.gang.peers[rank]} joined the running elastic gang ({len(present(state))} members "
                     f"now): starting its training in attempt {state.attempt}; torchrun's rendezvous takes it in "
                     f"at its next round")
    state.outbox.append((rank, {"type": "start", "attempt": state.attempt, "restarts": state.restarts,
                                "since": state.since}))


def leaves(state: ElasticState, rank: int, why: str) -> None:
    """A member said it is leaving: the gang goes on without it (and its training's exit is not judged)."""
    record = state.records[rank]
    record.left, record.status, record.code = True, IDLE, None
    state.log.append(f"{state.gang.peers[rank]} is leaving the elastic gang ({why or 'its launcher was stopped'}); "
                     f"not a failure: the others go on, torchrun's rendezvous re-forms without it "
                     f"({len(present(state))} members now)")


def lost(state: ElasticState, rank: int) -> None:
    """A member's launcher went away: after a `leave`, expected; without one, said, and treated the same."""
    record = state.records[rank]
    if not record.left and record.status == RUNNING:
        state.log.append(f"{state.gang.peers[rank]}: its launcher went away without leaving (node lost or "
                         f"container killed); the elastic gang goes on without it ({len(present(state))} members "
                         f"now) and takes it back when its pod returns")
    record.status, record.code, record.left = IDLE, None, False


def tick(state: ElasticState, now: float) -> Optional[Outcome]:
    """The gang's failure, with the reason, when it has been below `min` members for longer than the wait timeout
    while running (torchrun's rendezvous would wait as long and then fail without saying why); the coordinator
    ends the gang with it. None while it may go on."""
    low = state.gang.assembled_at
    here = present(state)
    if state.phase != "running" or len(here) >= low:
        state.short_since = None
        return None
    if state.short_since is None:
        state.short_since = now
        state.log.append(f"the elastic gang has {len(here)} member(s), fewer than its minimum of {low}: torchrun's "
                         f"rendezvous waits for more; failing the gang if none come within "
                         f"{state.policy.join_timeout:g}s")
        return None
    if now - state.short_since > state.policy.join_timeout:
        missing = [r for r in range(low) if r not in here]
        names = ", ".join(str(state.gang.peers[r]) for r in missing)
        return Outcome(FAILED, EXIT_NOT_ASSEMBLED, f"the elastic gang had only {len(here)} of its minimum "
                       f"{low} members for {state.policy.join_timeout:g}s (missing: {names}); scale the "
                       f"workload to at least {low} replicas", missing[0] if missing else 0, now_rfc3339(),
                       state.attempt, state.restarts)
    return None
