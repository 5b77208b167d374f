"""`trainhook submit`, `status`, `list`, `logs` and `delete`: the CLI over trainhook.cluster.client.

A gang is everything labeled `trainhook.dev/job-name=<name>`. `submit` checks the manifest with the webhook's
own code before creating anything, so a refusal leaves nothing half-created. Exit statuses: 0 done (for
`submit --wait`: the gang succeeded), 1 a failure or a refusal, 124 `--timeout` reached first.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

import yaml

from trainhook.gang import keys

EXIT_TIMEOUT = 124


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)")
    parser.add_argument("--context", help="the kubeconfig context to use (default: its current one)")
    parser.add_argument("-n", "--namespace", help="namespace (default: the context's, else default)")


def connect(args: argparse.Namespace):
    from trainhook.cluster.client import Cluster

    return Cluster.connect(args.kubeconfig, args.context, args.namespace)


def _said(message: str) -> str:
    """An error as kubectl prints it: the server's own `Error from server (...)`, else `error: ...`."""
    return message if message.startswith("Error from server") else f"error: {message}"


def _error(message: str) -> int:
    print(_said(message), file=sys.stderr)
    return 1


def _stamp(lines: list[str]) -> None:
    now = time.strftime("%H:%M:%S")
    for line in lines:
        print(f"{now} {line}", flush=True)


# --- submit -------------------------------------------------------------------------------------------------

def add_submit_arguments(parser: argparse.ArgumentParser) -> None:
    from trainhook.render.cli import EPILOG, add_gang_arguments

    parser.description = ("Create a training gang on the cluster, from a manifest (-f) or from render's flags, "
                          "and with --wait follow it until it succeeds or fails.")
    parser.epilog = "From flags, as with render:\n" + EPILOG.replace("trainhook render", "trainhook submit")
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("name", nargs="?", help="the gang's name (with render's flags; not with -f)")
    parser.add_argument("-f", "--filename", help="a manifest to create ('-': standard input)")
    parser.add_argument("--wait", action="store_true", help="show progress until the gang succeeds or fails")
    parser.add_argument("--timeout", type=float, metavar="SECONDS",
                        help=f"stop waiting after this long (exit {EXIT_TIMEOUT})")
    parser.add_argument("--interval", type=float, default=2.0, metavar="SECONDS", help="seconds between two looks")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)")
    parser.add_argument("--context", help="the kubeconfig context to use (default: its current one)")
    add_gang_arguments(parser, name_required=False)


def manifest_objects(text: str, path: str, namespace: str | None) -> list[dict]:
    """Every object of a manifest (checked by the webhook's own code first); raises ManifestError/Refused."""
    from trainhook.render.explain import explain_text

    explain_text(text, path, namespace)
    objects = []
    for doc in yaml.safe_load_all(text):
        if isinstance(doc, dict) and doc.get("kind") == "List":
            objects += [item for item in doc.get("items") or [] if isinstance(item, dict)]
        elif isinstance(doc, dict):
            objects.append(doc)
    return objects


def gang_names(objects: list[dict]) -> list[str]:
    from trainhook.cluster.client import workload_job_name
    names = []
    for obj in objects:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        if obj.get("kind") in ("StatefulSet", "Job", "Pod") and keys.FRAMEWORK in labels:
            name = workload_job_name(obj)
            if name not in names:
                names.append(name)
    return names


def submit_objects(args: argparse.Namespace) -> list[dict]:
    from trainhook.render.cli import rendered

    if args.filename:
        if args.name or getattr(args, "command_argv", None):
            raise ValueError("give either -f FILE or a NAME with render's flags (and -- CMD), not both")
        text = sys.stdin.read() if args.filename == "-" else Path(args.filename).read_text(encoding="utf-8")
        objects = manifest_objects(text, args.filename if args.filename != "-" else "<stdin>", args.namespace)
        if not objects:
            raise ValueError(f"{args.filename}: no objects to create")
        return objects
    if not args.name:
        raise ValueError("give a manifest with -f FILE, or a gang NAME with render's flags (see --help)")
    return rendered(args)


def submit_main(args: argparse.Namespace) -> int:
    from trainhook.cluster.client import ClusterError, wait_for_gang
    from trainhook.render.explain import Refused
    from trainhook.local.manifest import ManifestError

    try:
        objects = submit_objects(args)
        cluster = connect(args)
    except Refused as e:
        print(str(e), file=sys.stderr)
        return 1
    except (ManifestError, ClusterError, ValueError, OSError) as e:
        return _error(str(e))
    try:
        for obj in objects:
            cluster.create(obj)
            print(f"{obj['kind'].lower()}/{obj['metadata']['name']} created", flush=True)
        if not args.wait:
            return 0
        names = gang_names(objects)
        if len(names) != 1:
            return _error(f"--wait follows one gang; the manifest has {len(names)} ({', '.join(names)})")
        try:
            state = wait_for_gang(cluster, names[0], args.timeout, args.interval, _stamp)
        except TimeoutError as e:
            print(f"error: {e.args[0]}", file=sys.stderr)
            return EXIT_TIMEOUT
        return 0 if state.outcome == "Succeeded" else 1
    except ClusterError as e:
        return _error(str(e))
    finally:
        cluster.close()


# --- status, list -------------------------------------------------------------------------------------------

def add_status_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("A gang's pods in rank order (rank from the injected TRAINHOOK_RANK), their phases and "
                          "restarts, and the gang's outcome; for a finished gang, what was recorded with it (the "
                          "deciding rank and pod, exit code, attempts, start and end), even once its pods are gone.")
    parser.add_argument("name", help="the gang's name (its trainhook.dev/job-name)")
    add_connection_arguments(parser)


def status_main(args: argparse.Namespace) -> int:
    from trainhook.cluster.client import ClusterError, gang_state_of
    from trainhook.cluster.status import format_status

    try:
        cluster = connect(args)
        try:
            state = gang_state_of(cluster, args.name)
        finally:
            cluster.close()
    except ClusterError as e:
        return _error(str(e))
    print(format_status(state))
    return 1 if state.outcome == "NotFound" else 0


def add_list_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("The gangs of a namespace (everything labeled trainhook.dev/job-name), with their pods, "
                          "outcome, progress (the training's last report), duration and age (trainhook/cluster/"
                          "listing.py says each column).")
    add_connection_arguments(parser)
    parser.add_argument("-A", "--all-namespaces", action="store_true", help="the gangs of every namespace")
    parser.add_argument("-l", "--selector", default="", help="only gangs whose workload matches this label "
                        "selector (kubectl's syntax, e.g. team=vision,tier!=batch)")
    parser.add_argument("-o", "--output", choices=("wide", "json", "yaml"), help="wide: also workloads, last "
                        "metrics and detail; json|yaml: every field of each gang")
    parser.add_argument("-w", "--watch", action="store_true", help="after the list, a row for each gang that "
                        "changes, until interrupted")
    parser.add_argument("--interval", type=float, default=2.0, metavar="SECONDS", help="seconds between two looks "
                        "with --watch")


def list_main(args: argparse.Namespace) -> int:
    import datetime as dt

    from trainhook.cluster.client import ClusterError
    from trainhook.cluster.listing import format_gangs, watch
    from trainhook.cluster.status import gang_state

    output = args.output or "table"
    try:
        cluster = connect(args)
        try:
            def look():
                gangs = cluster.gangs_where(args.selector, args.all_namespaces)
                return [gang_state(name, namespace, g.workloads, g.pods) for (namespace, name), g in gangs.items()]

            def now() -> dt.datetime:
                return dt.datetime.now(dt.timezone.utc)

            if not args.watch:
                print(format_gangs(look(), output, now(), args.all_namespaces))
                return 0

            def pause() -> bool:
                time.sleep(max(0.1, args.interval))
                return True

            try:
                watch(look, lambda text: print(text, flush=True), output, now, pause, args.all_namespaces)
            except KeyboardInterrupt:
                pass
            return 0
        finally:
            cluster.close()
    except ClusterError as e:
        return _error(str(e))


# --- logs ---------------------------------------------------------------------------------------------------

def add_logs_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Every pod's log in rank order, each line prefixed with [pod]. A finished gang whose pods "
                          "are gone (a StatefulSet gang is scaled to zero) shows the last lines kept with its outcome "
                          "(the deciding rank's and rank 0's), said so on stderr.")
    parser.add_argument("name", help="the gang's name")
    parser.add_argument("-f", "--follow", action="store_true",
                        help="keep streaming every pod's log (waiting for pods that have not started)")
    parser.add_argument("-c", "--container", help="this container instead of the training container "
                                                  f"(e.g. {keys.GANG_WAIT_CONTAINER})")
    parser.add_argument("--tail", type=int, metavar="LINES", help="only the last LINES lines of each pod")
    add_connection_arguments(parser)


def logs_main(args: argparse.Namespace) -> int:
    """Every pod's log; a pod that went before its log could be read (a finished StatefulSet gang is scaled to
    zero) is shown by the last lines kept with the gang's outcome, said so on stderr (trainhook/cluster/logs.py)."""
    from trainhook.cluster.client import ClusterError
    from trainhook.cluster.logs import RECORD_WAIT, in_rank_order, kept_for, read_pod_log, state_of, wait_for_pods
    from trainhook.cluster.status import container_started, training_container_name

    try:
        cluster = connect(args)
    except ClusterError as e:
        return _error(str(e))
    lock = threading.Lock()
    failures: list[str] = []
    missed: list[dict] = []

    def emit_for(name: str):
        def emit(line: str) -> None:
            with lock:
                sys.stdout.write(f"[{name}] {line}\n")
                sys.stdout.flush()
        return emit

    def one(pod: dict) -> None:
        container = args.container or training_container_name(pod)
        if not args.follow and not container_started(pod, container):
            with lock:
                print(f"[{pod['metadata']['name']}] (no log yet: {container} has not started)", file=sys.stderr)
            return
        try:
            if not read_pod_log(cluster, pod, container, args.follow, args.tail, emit_for(pod["metadata"]["name"])):
                missed.append(pod)
        except ClusterError as e:
            failures.append(str(e))

    try:
        state, pods = wait_for_pods(cluster, args.name) if args.follow else state_of(cluster, args.name)
        if not pods and not state.finished:
            return _error(f"gang {args.name} has no pods in namespace {cluster.namespace}")
        pods = in_rank_order(pods)
        if args.follow:
            threads = [threading.Thread(target=one, args=(pod,), daemon=True) for pod in pods]
            for thread in threads:
                thread.start()
            for thread in threads:
                while thread.is_alive():
                    thread.join(0.5)
        else:
            for pod in pods:
                one(pod)
        if not pods or missed:
            _, kept = kept_for(cluster, args.name, wait=0 if not pods else RECORD_WAIT)
            failures += print_kept(args.name, kept, in_rank_order(missed), not pods)
    except ClusterError as e:
        failures.append(str(e))
    finally:
        cluster.close()
    for failure in dict.fromkeys(failures):  # a server gone mid-way fails every pod's read alike: said once
        print(_said(failure), file=sys.stderr)
    return 1 if failures else 0


def print_kept(name: str, kept, missed: list[dict], whole: bool) -> list[str]:
    """Print the kept last lines for the pods that went (every kept rank when `whole`: the gang has no pods at
    all); returns what could not be shown."""
    from trainhook.cluster.logs import kept_label, kept_of_pod, notice

    shown = list(kept) if whole else [k for k in (kept_of_pod(kept, pod) for pod in missed) if k is not None]
    for entry in shown:
        print(notice(entry), file=sys.stderr, flush=True)
        for line in entry.lines.splitlines():
            sys.stdout.write(f"[{kept_label(entry)}] {line}\n")
        sys.stdout.flush()
    if whole and not shown:
        return [f"gang {name} is finished and its pods are gone; no last lines were kept with its outcome (they are "
                "kept when its launchers record it through the notary: docs/use/gang-lifecycle.md)"]
    for pod in missed:
        if kept_of_pod(kept, pod) is None:
            print(f"[{pod['metadata']['name']}] (its pod went before its log could be read; only the deciding "
                  "rank's and rank 0's last lines are kept with the outcome)", file=sys.stderr, flush=True)
    return []


# --- delete -------------------------------------------------------------------------------------------------

def add_delete_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = "Delete a gang: its StatefulSets or Jobs (and their pods), bare pods, Service and PodGroup."
    parser.add_argument("name", help="the gang's name")
    add_connection_arguments(parser)


def delete_main(args: argparse.Namespace) -> int:
    from trainhook.cluster.client import ClusterError

    try:
        cluster = connect(args)
        try:
            deleted = cluster.delete_gang(args.name)
        finally:
            cluster.close()
    except ClusterError as e:
        return _error(str(e))
    if not deleted:
        return _error(f"gang {args.name} not found in namespace {cluster.namespace}")
    for what in deleted:
        print(f"{what} deleted")
    return 0
