"""How a gang member ends once its gang's outcome is known, for `run` (gang_run) and the MPI commands alike.

Only the coordinator (rank 0's launcher: the MPI launcher for an MPI gang) records the outcome, through the
notary (notary_client.py, POST /v1/outcome), which annotates and labels the gang's workloads, scales a StatefulSet
to zero and emits an Event: the pods hold no Kubernetes permission. Then the member exits, or, where its
container would be rerun (restartPolicy Always: a StatefulSet's pods), parks: it stays up, idle, until the pod
is stopped, so a finished gang never trains again. A notary that cannot be reached is one line in the log, not a
hang and not a crash. Under `trainhook local` it also keeps the runner's status file, which is how the runner
knows the container is gang-aware and parked.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

from trainhook.gang import keys
from trainhook.launcher import notary_client
from trainhook.launcher.pod_view import GangView
from trainhook.launcher.outcome import FAILED, SUCCEEDED, Outcome, now_rfc3339
from trainhook.launcher.policy import LaunchSettings
from trainhook.launcher.process import reap_exited
from trainhook.launcher.reach import uniform
from trainhook.launcher.speak import speaker
from trainhook.launcher.files import write_json_atomically

TYPE_CHECKING = False  # typing's own, without importing typing (trainhook/launcher/__init__.py says why)
if TYPE_CHECKING:
    from typing import Callable

COORDINATOR_RANK = 0  # the notary's anchor: rank 0's pod (for MPI, the launcher, which the webhook ranks first)
MARKER = "outcome.json"  # in TRAINHOOK_STATE_DIR: the outcome, for this pod's restarted containers
RECORD_DEADLINE = 20.0  # how long the coordinator tries the notary at the end before it says it is not recorded yet
RECORD_PATIENCE = 15 * 60.0  # how long more one that exits (its container is not rerun) keeps trying first
KEEP_DELAY_FIRST, KEEP_DELAY_MAX = 2.0, 30.0  # the delays between tries once the first ones failed


say = speaker()


def record_through_notary(gang: GangView, settings: LaunchSettings, outcome: Outcome, log=say,
                   notary: notary_client.NotaryClient | None = None, details: dict | None = None) -> str:
    """The coordinator records the outcome through the notary (which also stops a StatefulSet and emits the
    Event); the other members leave it to it. Returns what happened, in words, for the exit or parking message.
    `details` go with it for a finished gang's inspection (notary_client.NotaryClient.record_outcome).

    The outcome is kept until the notary has recorded it (issue 31: a gang that ended while trainhook's Deployment
    was away was never recorded, and held its pods): a coordinator that parks keeps trying in the background for
    as long as it is parked; one whose container would not be rerun keeps trying before it exits, for at most
    RECORD_PATIENCE. Either way with a growing delay, each try with the pod's current token (the kubelet refreshes
    it) against whichever notary answers then (a restarted one, a rotated key)."""
    if gang.rank != COORDINATOR_RANK:
        return f"the coordinator ({gang.peers[COORDINATOR_RANK]}) records the outcome through the notary"
    if notary is None and not settings.notary_url:
        return f"the outcome is recorded nowhere: no notary ({keys.TH_NOTARY} is not set)"
    recorder = Recorder(settings, outcome, details, log, notary)
    if recorder.attempt(time.monotonic() + RECORD_DEADLINE):
        return recorder.said
    if settings.parks and not recorder.malformed:
        threading.Thread(target=recorder.keep_trying, name="trainhook-record", daemon=True).start()
        return f"the outcome is not recorded yet ({recorder.last}); kept, and tried again until the notary records it"
    if not recorder.refused and recorder.keep_trying(time.monotonic() + RECORD_PATIENCE):
        return recorder.said
    return f"the outcome is not recorded (the notary: {recorder.last})"


class Recorder:
    """One outcome on its way to the notary: tries, and what came of them (`said`, `last`)."""

    def __init__(self, settings: LaunchSettings, outcome: Outcome, details: dict | None, log,
                 notary: notary_client.NotaryClient | None) -> None:
        self.settings, self.outcome, self.details, self.log, self.notary = settings, outcome, details, log, notary
        self.said, self.last, self.tries = "", "", 0
        self.refused = self.malformed = False  # the last answer: a "no" (4xx but 429), a "never" (400)

    def attempt(self, until: float) -> bool:
        """Try until recorded, refused or `until`, with quick jittered retries while the notary cannot answer (no
        answer, 429, 5xx), as at start."""
        while True:
            self.tries += 1
            try:
                if self.notary is None:
                    self.notary = notary_client.from_settings(self.settings)
                recorded = self.notary.record_outcome(self.outcome, self.details) if self.notary else None
            except notary_client.NotaryError as e:
                self.last = str(e)
                self.refused = e.status is not None and e.status not in (429, 502, 503, 504)
                self.malformed = e.status == 400
                if self.refused or time.monotonic() > until:
                    self.log(f"the outcome is not recorded: {self.last}")
                    return False
                time.sleep(uniform(notary_client.FIRST_DELAY, notary_client.MAX_DELAY))
                continue
            if recorded is None:
                self.last = f"no notary ({keys.TH_NOTARY} is not set)"
                return False
            self.said = self._recorded(recorded)
            return True

    def keep_trying(self, until: float = float("inf")) -> bool:
        """Try again after a delay that grows to KEEP_DELAY_MAX, until recorded, refused as malformed, or `until`: a
        parked coordinator asks again after a refusal too (a token the kubelet refreshed, a notary that came back
        with its gang's pods in its cache)."""
        delay = KEEP_DELAY_FIRST
        while time.monotonic() + delay < until:
            time.sleep(uniform(delay / 2, delay))
            if self.attempt(time.monotonic()):
                self.log(f"{self.said} (after {self.tries} tries)")
                return True
            if self.malformed:
                return False
            delay = min(delay * 2, KEEP_DELAY_MAX)
        return False

    def _recorded(self, recorded: Outcome) -> str:
        if (recorded.phase, recorded.code) != (self.outcome.phase, self.outcome.code):
            self.log(f"the notary kept the outcome recorded earlier: {recorded.summary()}")
        else:
            self.log(f"the notary recorded the outcome: {recorded.phase}")
        stops = " and stops it (a StatefulSet is scaled to zero)" if self.settings.workload_kind == "StatefulSet" \
            else ""
        return f"the notary recorded {recorded.phase} on the gang's workloads{stops}"


def recorded_outcome(notary: notary_client.NotaryClient | None, settings: LaunchSettings, log=say) -> Outcome | None:
    """What the notary recorded for this gang before this launcher started (rank 0: a restarted coordinator
    learns the outcome from the notary, never from what a member claims)."""
    if notary is None:
        return None
    try:
        outcome = notary.recorded_outcome()
    except notary_client.NotaryError as e:
        log(f"could not ask the notary for the gang's recorded outcome ({e}); going on as a new gang")
        return None
    if outcome is not None:
        kind, name = settings.workload_kind, settings.workload_name
        log(f"the notary records that the gang is done ({outcome.phase}: {outcome.reason}); to run it again, "
            f"remove the label and annotation: kubectl label {kind.lower()} {name} trainhook.dev/phase- && "
            f"kubectl annotate {kind.lower()} {name} trainhook.dev/phase-")
    return outcome


def read_marker(settings: LaunchSettings, gang: GangView, log=say) -> Outcome | None:
    """The outcome this pod's outcome marker records (TRAINHOOK_STATE_DIR, an emptyDir outlives container restarts),
    if it is this gang's: so a restarted container never reruns finished training."""
    if not settings.state_dir:
        return None
    path = os.path.join(settings.state_dir, MARKER)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.loads(f.read())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        log(f"ignored the outcome marker {path}: {e}")
        return None
    if (data.get("namespace"), data.get("job")) != (gang.namespace, gang.job_name):
        return None
    try:
        outcome = Outcome.from_dict(data.get("outcome") or {})
    except ValueError as e:
        log(f"ignored the outcome marker {path}: {e}")
        return None
    log(f"{path} records that the gang is done ({outcome.phase})")
    return outcome


def write_marker(settings: LaunchSettings, gang: GangView, outcome: Outcome | None, log=say) -> None:
    """Keep the outcome in this pod's outcome marker (read_marker), when there is a state directory."""
    if not settings.state_dir or outcome is None:
        return
    data = {"namespace": gang.namespace, "job": gang.job_name, "outcome": outcome.to_dict()}
    try:
        write_json_atomically(os.path.join(settings.state_dir, MARKER), data)
    except OSError as e:
        log(f"cannot write the outcome marker in {settings.state_dir}: {e}")


def write_local_status(settings: LaunchSettings, data: dict, log=say) -> None:
    """The launcher's state for `trainhook local` (TRAINHOOK_LOCAL_STATUS); nothing in a cluster."""
    if not settings.local_status:
        return
    try:
        write_json_atomically(settings.local_status, data)
    except OSError as e:
        log(f"cannot write the local status file {settings.local_status}: {e}")


def status_document(gang: GangView, state: str, outcome: Outcome | None, attempt: int = 1,
                    training_code: int | None = None) -> dict:
    return {"pid": os.getpid(), "state": state, "namespace": gang.namespace, "job": gang.job_name,
            "rank": gang.rank, "attempt": attempt, "training_code": training_code,
            "outcome": None if outcome is None else outcome.to_dict(), "time": time.time()}


def outcome_of(code: int, reason: str, rank: int) -> Outcome:
    """An outcome decided by one member (the MPI launcher: mpirun's exit code)."""
    return Outcome(SUCCEEDED if code == 0 else FAILED, code, reason, rank, now_rfc3339(), attempt=1)


def park_until_stopped(reap: bool) -> int:
    """Stay up until SIGTERM or SIGINT (the pod is being stopped); returns the signal's number."""
    received: list[int] = []

    def stop(signum: int, _frame: object) -> None:
        received.append(signum)

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        while not received:
            time.sleep(0.5)
            if reap:
                reap_exited()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return received[0]


def exit_or_park(settings: LaunchSettings, code: int, recorded: str, status: Callable[[str], None],
                 wait_for_stop: Callable[[], int], log=say) -> int:
    """The one decision of how a member ends, once the gang is done and the outcome is recorded (`recorded`, in
    words): exit with `code` where the container is not rerun, else park until the pod is stopped
    (`wait_for_stop` blocks until SIGTERM or SIGINT and returns its number), then exit with `code`. `status`
    keeps the local runner's state ("exiting", "parked"). Used by end_member (the MPI commands) and by
    gang_run.MemberLauncher.finalize, which waits for the stop on its own event queue."""
    if not settings.parks:
        log(f"exiting {code}: the gang is done (restartPolicy {settings.restart_policy}: this container is not "
            f"rerun); {recorded}")
        status("exiting")
        return code
    log(f"parked: the gang is done and this pod's containers are restarted when they exit (restartPolicy Always), "
        f"so the launcher stays up without rerunning the training until the pod is stopped; {recorded}")
    status("parked")
    signum = wait_for_stop()
    log(f"stopped by {signal.Signals(signum).name} while parked; exiting {code}")
    status("exiting")
    return code


def end_member(gang: GangView, settings: LaunchSettings, outcome: Outcome, code: int, log=say,
               training_code: int | None = None) -> int:
    """Record (the coordinator only), then exit with `code`, or park where the container would be rerun."""
    recorded = record_through_notary(gang, settings, outcome, log)

    def status(state: str) -> None:
        write_local_status(settings, status_document(gang, state, outcome, training_code=training_code), log)

    return exit_or_park(settings, code, recorded, status, lambda: park_until_stopped(reap=os.getpid() == 1), log)
