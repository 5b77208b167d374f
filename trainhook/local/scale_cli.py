"""The command side of `trainhook local scale [RUN_DIR] statefulset/NAME --replicas N` and `trainhook local delete
[RUN_DIR] pod/NAME` (scaling.py is the runner's).

They print what kubectl prints (`statefulset.apps/NAME scaled`, `pod "NAME" deleted`, or the API server's refusal)
and exit 0 or 1, so a script written against `kubectl scale` / `kubectl delete pod` reads the same here.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from pathlib import Path

from trainhook.launcher.files import write_json_atomically
from trainhook.local.scaling import ANSWER_TIMEOUT, CONTROL, POLL, RUNNER_FILE, alive, live_runs

KINDS = ("statefulset", "statefulsets", "sts", "statefulset.apps", "statefulsets.apps")


class ScaleError(Exception):
    """The command cannot be carried out (no run, bad target); printed as `error: ...`, exit 1."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trainhook local scale", usage=(
        "trainhook local scale [RUN_DIR] statefulset/NAME --replicas N [-n NAMESPACE] [--timeout S]"), description=(
        "Scale a StatefulSet of a running `trainhook local` run, as `kubectl scale` scales one on a cluster: the "
        "webhook's scale rule accepts or refuses the size; new pods are admitted through the webhook, removed "
        "ones are stopped as a kubelet stops a deleted pod."))
    p.add_argument("where", nargs="+", metavar="[RUN_DIR] statefulset/NAME",
                   help="the run's directory (its --workdir; optional when one run is running) and the target")
    p.add_argument("--replicas", type=int, required=True, help="the new number of replicas")
    p.add_argument("-n", "--namespace", default="default", help="the StatefulSet's namespace (default: default)")
    p.add_argument("--timeout", type=float, default=ANSWER_TIMEOUT,
                   help=f"seconds to wait for the run to answer (default {ANSWER_TIMEOUT:g})")
    return p


def target_name(target: str) -> str:
    """NAME of `statefulset/NAME`; ScaleError for anything else, naming what is supported."""
    kind, sep, name = target.partition("/")
    if not sep or not name or kind.lower() not in KINDS:
        raise ScaleError(f"{target!r}: give the target as statefulset/NAME (a local run scales StatefulSets; a "
                         f"Job's size is its spec.completions, which `trainhook local` runs as written)")
    return name


def run_dir_of(given: str | None) -> Path:
    """The run to scale: the one given (it must be running), or the only one running."""
    if given is not None:
        path = Path(given)
        try:
            info = json.loads((path / CONTROL / RUNNER_FILE).read_text())
        except (OSError, ValueError):
            raise ScaleError(f"{path}: no `trainhook local` run is running with this run directory (start it with "
                             f"--workdir {path})") from None
        if not alive(int(info.get("pid", 0))):
            raise ScaleError(f"{path}: its `trainhook local` run (pid {info.get('pid')}) has ended")
        return path
    runs = live_runs()
    if len(runs) == 1:
        return runs[0]
    if not runs:
        raise ScaleError("no `trainhook local` run is running; start one, or give its run directory")
    raise ScaleError(f"{len(runs)} `trainhook local` runs are running ({', '.join(map(str, runs))}); give the run "
                     f"directory of the one to scale")


def ask(run_dir: Path, body: dict, timeout: float) -> dict:
    """Hand a request to the runner and wait for its answer ({"ok", "message", "warnings"})."""
    control = run_dir / CONTROL
    ident = uuid.uuid4().hex
    request = control / f"scale-{time.time_ns()}-{ident}.request.json"
    answer = request.with_name(request.name.replace(".request", ".answer"))
    write_json_atomically(request, body)
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            data = json.loads(answer.read_text())
        except (OSError, ValueError):
            time.sleep(POLL)
            continue
        answer.unlink(missing_ok=True)
        return data
    request.unlink(missing_ok=True)
    raise ScaleError(f"the run in {run_dir} did not answer within {timeout:g}s (is it still starting its pods?)")


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if len(args.where) > 2:
        parser().error("give at most RUN_DIR and statefulset/NAME")
    try:
        name = target_name(args.where[-1])
        if args.replicas < 0:
            raise ScaleError(f"--replicas={args.replicas}: must be 0 or more")
        run_dir = run_dir_of(args.where[0] if len(args.where) == 2 else None)
        answer = ask(run_dir, {"name": name, "namespace": args.namespace, "replicas": args.replicas},
                     args.timeout)
    except ScaleError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return report(answer)


def delete_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trainhook local delete", usage=(
        "trainhook local delete [RUN_DIR] pod/NAME [-n NAMESPACE] [--timeout S]"), description=(
        "Delete a pod of a running `trainhook local` run, as `kubectl delete pod` does (an eviction does the same "
        "to a pod): its containers get SIGTERM, then SIGKILL after its grace period; a StatefulSet's pod is then "
        "created again by its controller, through the webhook."))
    p.add_argument("where", nargs="+", metavar="[RUN_DIR] pod/NAME")
    p.add_argument("-n", "--namespace", default="default", help="the pod's namespace (default: default)")
    p.add_argument("--timeout", type=float, default=ANSWER_TIMEOUT,
                   help=f"seconds to wait for the run to answer (default {ANSWER_TIMEOUT:g})")
    return p


def delete_main(argv: list[str]) -> int:
    args = delete_parser().parse_args(argv)
    if len(args.where) > 2:
        delete_parser().error("give at most RUN_DIR and pod/NAME")
    try:
        kind, sep, name = args.where[-1].partition("/")
        if not sep or not name or kind.lower() not in ("pod", "pods", "po"):
            raise ScaleError(f"{args.where[-1]!r}: give the target as pod/NAME")
        run_dir = run_dir_of(args.where[0] if len(args.where) == 2 else None)
        answer = ask(run_dir, {"pod": name, "namespace": args.namespace}, args.timeout)
    except ScaleError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return report(answer)


def report(answer: dict) -> int:
    """Print the runner's answer as kubectl would; the exit status."""
    for warning in answer.get("warnings") or []:
        print(f"Warning: {warning}", file=sys.stderr)
    if not answer.get("ok"):
        print(answer.get("message", "error: refused"), file=sys.stderr)
        return 1
    print(answer.get("message", ""))
    return 0
