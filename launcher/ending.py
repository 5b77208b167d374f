"""How a gang member ends once its gang's outcome is known, for `run` (gang_run) and the MPI commands alike.

The first member of each role records the outcome on its workload and scales a StatefulSet to zero (what its
ServiceAccount allows; otherwise it says why, once). Then the member exits, or, where its container would be
rerun (restartPolicy Always: a StatefulSet's pods), parks: it stays up, idle, until the pod is stopped, so a
finished gang never trains again. Under `trainhook local` it also keeps the runner's status file, which is how
the runner knows the container is gang-aware and parked.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from trainhook.launcher import outcome_api
from trainhook.launcher.gang import Gang
from trainhook.launcher.lifecycle import FAILED, SUCCEEDED, Outcome, Settings, now_rfc3339
from trainhook.launcher.run import reap_exited


def say(message: str) -> None:
    print(f"trainhook-launch: {message}", file=sys.stderr, flush=True)


def record_outcome(gang: Gang, settings: Settings, outcome: Outcome, log=say) -> str:
    """The first member of each role records the outcome on its workload and scales a StatefulSet to zero.
    Returns what happened, in words, for the exit or parking message."""
    kind, name = settings.workload_kind, settings.workload_name
    leader = f"{gang.role}-0"
    if gang.index != 0:
        return (f"{leader} records the outcome on {kind}/{name}"
                + (" and scales it to zero" if kind == "StatefulSet" else "") + " when its ServiceAccount may")
    if kind not in outcome_api.KINDS or not name:
        return f"the outcome is recorded nowhere: a {kind or 'bare Pod'} gang has no workload to record it on"
    scaled = " and it is not scaled to zero" if kind == "StatefulSet" else ""
    try:
        api = outcome_api.client(settings.service_account_dir)
    except outcome_api.Unavailable as e:
        return f"the outcome is not recorded on {kind}/{name}{scaled}: {e}"
    with api:
        try:
            outcome_api.record_outcome(api, kind, name, gang.namespace, outcome)
            log(f"recorded the outcome on {kind}/{name}: {outcome.phase}")
        except outcome_api.Unavailable as e:
            log(str(e))
            return f"the outcome is not recorded on {kind}/{name}{scaled}: {e}"
        if kind != "StatefulSet":
            return f"the outcome is recorded on {kind}/{name}"
        try:
            outcome_api.scale_to_zero(api, name, gang.namespace)
        except outcome_api.Unavailable as e:
            log(str(e))
            return f"the outcome is recorded on {kind}/{name}, but it is not scaled to zero: {e}"
    log(f"scaled {kind}/{name} to zero: its controller deletes the gang's pods")
    return f"{kind}/{name} is scaled to zero, so its pods are deleted shortly"


def write_atomically(path: Path, data: dict) -> None:
    """Write JSON through a temporary name and rename: a reader never sees half a file (OSError on failure)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    temporary.write_text(json.dumps(data))
    os.replace(temporary, path)


def write_local_status(settings: Settings, data: dict, log=say) -> None:
    """The launcher's state for `trainhook local` (TRAINHOOK_LOCAL_STATUS); nothing in a cluster."""
    if not settings.local_status:
        return
    try:
        write_atomically(Path(settings.local_status), data)
    except OSError as e:
        log(f"cannot write the local status file {settings.local_status}: {e}")


def status_document(gang: Gang, state: str, outcome: Outcome | None, attempt: int = 1,
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


def end_member(gang: Gang, settings: Settings, outcome: Outcome, code: int, log=say,
               training_code: int | None = None) -> int:
    """Record (as the first of its role), then exit with `code`, or park where the container would be rerun."""
    recorded = record_outcome(gang, settings, outcome, log)
    if not settings.parks:
        log(f"exiting {code}: the gang is done (restartPolicy {settings.restart_policy}: this container is not "
            f"rerun); {recorded}")
        write_local_status(settings, status_document(gang, "exiting", outcome, training_code=training_code), log)
        return code
    log(f"parked: the gang is done and this pod's containers are restarted when they exit (restartPolicy Always), "
        f"so the launcher stays up without rerunning the training until the pod is stopped; {recorded}")
    write_local_status(settings, status_document(gang, "parked", outcome, training_code=training_code), log)
    signum = park_until_stopped(reap=os.getpid() == 1)
    log(f"stopped by {signal.Signals(signum).name} while parked; exiting {code}")
    write_local_status(settings, status_document(gang, "exiting", outcome, training_code=training_code), log)
    return code
