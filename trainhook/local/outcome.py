"""A local run's outcome, decided from what its pods did and what their launchers recorded.

Kept apart from the supervisor (which runs the containers, restarts them and stops them): these are pure
functions of the records it keeps (results.py) and of each gang-aware pod's launcher state file, so the rule for
a run's exit code and reason reads in one place.
"""

from __future__ import annotations

from collections.abc import Callable

from trainhook.local.pods import LocalPod
from trainhook.local.results import PodResult, RunResult


def gang_outcomes(pods: list[LocalPod], results: dict[str, PodResult], parked: set[str],
                  read_status: Callable[[LocalPod], dict | None]) -> dict[str, dict]:
    """namespace/job -> the outcome its launchers recorded, with the pod that decided it. Marks each gang-aware
    pod's result with its gang and its training command's exit, and a pod parked at the end as Parked."""
    gangs: dict[str, dict] = {}
    for pod in pods:
        state = read_status(pod)
        if not state:
            continue
        result = results[pod.name]
        result.gang = f"{state.get('namespace')}/{state.get('job')}"
        result.training_exit = state.get("training_code")
        if pod.name in parked and result.reason in ("Terminated", "Running"):
            result.reason = "Parked"
        outcome = state.get("outcome")
        if outcome and result.gang not in gangs:
            gangs[result.gang] = dict(outcome)
    for gang, outcome in gangs.items():
        deciding = [p for p in pods
                    if results[p.name].gang == gang and results[p.name].rank == str(outcome.get("rank"))]
        outcome["pod"] = deciding[0].name if deciding else ""
    return gangs


def gang_line(name: str, outcome: dict) -> str:
    """The line the run prints for each gang's outcome."""
    restarts = outcome.get("restarts") or 0
    return (f"trainhook local: gang {name} {str(outcome.get('phase', '')).lower()} (exit {outcome.get('code')}; "
            f"attempt {outcome.get('attempt')}, {restarts} gang restart{'s' if restarts != 1 else ''}): "
            f"{outcome.get('reason')}")


def run_outcome(pods: list[PodResult], gangs: dict[str, dict], reason: str, exit_code: int,
                first_failure: str) -> RunResult:
    """The run's result. A run that ended on its own ("Succeeded": every pod settled or parked) still failed when
    a gang failed (the earliest failure decides the code), when a gang-aware pod's launcher exited before its gang
    had an outcome, or when any other container failed; a run stopped for a reason (Failed, Timeout,
    Interrupted) keeps that reason and code."""
    if reason == "Succeeded":
        failed_gangs = [(name, o) for name, o in gangs.items() if o.get("phase") != "Succeeded"]
        if failed_gangs:
            name, outcome = min(failed_gangs, key=lambda item: str(item[1].get("time")))
            pod = f" [pod {outcome['pod']}]" if outcome.get("pod") else ""
            return RunResult(pods, int(outcome.get("code") or 1), "Failed",
                             f"gang {name} failed: {outcome.get('reason')}{pod}", gangs)
        undecided = [p for p in pods if p.gang and p.gang not in gangs]
        if undecided:
            result = undecided[0]
            code = next((c.exit_code for c in reversed(result.containers)
                         if c.kind == "main" and c.name == result.training), None) or 1
            return RunResult(pods, code, "Failed", f"gang {result.gang}: {result.name}'s launcher exited with "
                             f"{code} before the gang had an outcome", gangs)
        # No training container failed, but another one may have: the run still did not succeed.
        failed = sorted(((c.finished or 0, p.name, c) for p in pods for c in p.containers if c.failed),
                        key=lambda item: item[:2])
        if failed:
            _, name, record = failed[0]
            return RunResult(pods, record.exit_code or 1, "Failed",
                             f"{name}/{record.name} exited with {record.exit_code}", gangs)
    return RunResult(pods, exit_code, reason, first_failure, gangs)
