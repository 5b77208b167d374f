"""`helm uninstall`'s check for running gangs (issue 23 item 10): the chart's pre-delete hook runs this module.

Why: without the webhook, a running gang's StatefulSet or Job re-creates a pod that exits or is deleted without the
webhook's wiring (no RANK, no WORLD_SIZE, no launcher); it fails and restarts forever. And the notary goes with the
webhook, so no member can get its gang's key again and no outcome is recorded (a finished StatefulSet is never
scaled to zero: it restarts too). Nothing in Kubernetes says so at uninstall: this check does, before anything is
deleted (docs/operate/helm.md, "Uninstalling").

What counts as running: a pod labeled `trainhook.dev/framework` (a gang's pods always are: the label is on their
template) that is Pending or Running and not being deleted, in a namespace the webhook serves (not the excluded
ones). Its gang is its `trainhook.dev/job-name` label in its namespace, its workload its controller (the pod itself
for a bare Pod). One paged, label-selected list of pods, as the chart's `<fullname>-uninstall-check` ServiceAccount,
which may list pods and nothing else (never the webhook's own: a pod run as that holds the notary's rights).

`--mode refuse` exits 1 naming the gangs and the fix (Helm then stops the uninstall and, from 3.18 on, prints these
lines: the hook's `helm.sh/hook-output-log-policy`); `--mode warn` names them and exits 0. An API error refuses too
(in warn mode it warns): uninstalling blind is what the check is there to prevent, and `--no-hooks` forces it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import Any

from trainhook.gang import keys

PAGE_SIZE = 500
API_TIMEOUT = 30  # seconds per page
MAX_SHOWN = 20  # gangs named one per line; the rest counted
RUNNING_PHASES = ("Pending", "Running", "Unknown")


def running_gang_pods(pods: Iterable[dict], excluded: frozenset) -> Iterator[dict]:
    for pod in pods:
        meta = pod.get("metadata") or {}
        if meta.get("namespace") in excluded or meta.get("deletionTimestamp"):
            continue
        if keys.FRAMEWORK in (meta.get("labels") or {}) and (pod.get("status") or {}).get("phase") in RUNNING_PHASES:
            yield pod


def workload_of(pod: dict) -> str:
    meta = pod.get("metadata") or {}
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller"):
            return f"{ref.get('kind')} {ref.get('name')}"
    return f"Pod {meta.get('name')}"


def gangs(pods: Iterable[dict]) -> dict[tuple[str, str], dict[str, int]]:
    """{(namespace, gang): {workload: pods}}: a gang's name is its job-name label, else its workload's name."""
    found: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for pod in pods:
        meta = pod["metadata"]
        workload = workload_of(pod)
        gang = (meta.get("labels") or {}).get(keys.JOB_NAME) or workload.split(" ", 1)[1]
        found[(meta.get("namespace", ""), gang)][workload] += 1
    return found


def describe(found: dict[tuple[str, str], dict[str, int]]) -> list[str]:
    lines = []
    for (namespace, gang), workloads in sorted(found.items())[:MAX_SHOWN]:
        parts = [f"{workload} ({count} pod{'s' if count != 1 else ''})"
                 for workload, count in sorted(workloads.items())]
        lines.append(f"  {namespace}/{gang}: {', '.join(parts)}")
    if len(found) > MAX_SHOWN:
        lines.append(f"  ... and {len(found) - MAX_SHOWN} more")
    return lines


def list_pods(api_client: Any) -> Iterator[dict]:
    """Every pod labeled trainhook.dev/framework, in every namespace, a page at a time (plain dicts)."""
    from kubernetes import client
    core = client.CoreV1Api(api_client)
    token = None
    while True:
        # _preload_content=False: urllib3's raw response (its .data), not the V1PodList the client's types promise
        response: Any = core.list_pod_for_all_namespaces(label_selector=keys.FRAMEWORK, limit=PAGE_SIZE,
                                                         _continue=token, _preload_content=False,
                                                         _request_timeout=API_TIMEOUT)
        page = json.loads(response.data)
        yield from page.get("items") or []
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return


def report(found: dict, mode: str, release: str, namespace: str) -> tuple[int, str]:
    """(exit code, what to print) for the gangs found."""
    force = f"helm uninstall {release} -n {namespace} --no-hooks"
    if not found:
        return 0, f"trainhook: no training gang is running; uninstalling release {release}"
    count = f"{len(found)} training gang{'s are' if len(found) != 1 else ' is'} still running"
    head = (f"trainhook: refusing to uninstall release {release}: {count}:" if mode == "refuse" else
            f"trainhook: WARNING: uninstalling release {release} while {count}:")
    return (1 if mode == "refuse" else 0), "\n".join([
        head, *describe(found),
        "Without the webhook, their workloads re-create pods unwired (no RANK, no WORLD_SIZE, no launcher), which "
        "fail and restart forever, and no gang's outcome can be recorded.",
        "Drain first: let them finish, or delete their workloads (kubectl delete statefulset NAME -n NAMESPACE); "
        f"what still runs: kubectl get pods -A -l {keys.FRAMEWORK} (docs/operate/helm.md, Uninstalling).",
        f"Then uninstall again; to uninstall anyway: {force}" if mode == "refuse" else
        "Their pods will not be re-created wired until trainhook is installed again."])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m trainhook.webhook.uninstall_check", description=(
        "Before `helm uninstall`: name the training gangs still running (the chart's pre-delete hook)."))
    parser.add_argument("--mode", choices=("refuse", "warn"), default="refuse",
                        help="refuse: exit 1 while gangs run (Helm stops the uninstall); warn: name them, exit 0")
    parser.add_argument("--release", required=True, help="the Helm release (named in the fix)")
    parser.add_argument("--release-namespace", required=True, help="the release's namespace (named in the fix)")
    parser.add_argument("--exclude-namespaces", default="",
                        help="comma-separated namespaces the webhook never serves (their pods are not its gangs)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    excluded = frozenset(n.strip() for n in args.exclude_namespaces.split(",") if n.strip())
    from trainhook.webhook.selfcerts import kube_client
    try:
        with kube_client() as api_client:
            found = gangs(running_gang_pods(list_pods(api_client), excluded))
    except Exception as e:  # noqa: BLE001 - the client's, urllib3's and the API server's many kinds: all say "unknown"
        verdict = "refusing to uninstall" if args.mode == "refuse" else "WARNING: uninstalling"
        print(f"trainhook: {verdict} release {args.release} without knowing which gangs run: listing pods labeled "
              f"{keys.FRAMEWORK} failed: {str(e).splitlines()[0] if str(e) else type(e).__name__}. To uninstall "
              f"anyway: helm uninstall {args.release} -n {args.release_namespace} --no-hooks", flush=True)
        return 1 if args.mode == "refuse" else 0
    code, text = report(found, args.mode, args.release, args.release_namespace)
    print(text, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
