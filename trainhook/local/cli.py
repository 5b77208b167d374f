"""`trainhook local MANIFEST`: run a labeled manifest's gang on this machine, as a cluster would.

The real webhook admits the objects, the StatefulSet/Job controllers are emulated to make the pods, each pod
gets its own network namespace, address and hosts file, and the containers' commands run here (images are
not pulled: commands run with the current Python environment). Exit status: 0 when every container
succeeded, else the first failure's exit code (124 on --timeout, 130/143 when interrupted).

The run directory (logs, outcome.json) is temporary and removed at exit unless --keep-dir or --workdir DIR, so
what is printed never names a directory that will be gone: the first line says which case it is, and the closing
lines say where the logs and the outcome are (the terminal alone, or the kept directory).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from trainhook.local.admission import NOTARY_PORT, AdmissionError, WebhookServer
from trainhook.local.controllers import ControllerError
from trainhook.local.envvars import EnvError
from trainhook.local.manifest import ManifestError, load_manifest
from trainhook.local.network import Network, NetworkError, check_host
from trainhook.local.notary_relay import NotaryRelay
from trainhook.local.run import address_warnings, admit_manifest, pods_yaml, prepare_pods, run_pods
from trainhook.local.scaling import Scaler
from trainhook.local.supervisor import RunResult
from trainhook.webhook.notary.local import store_workloads


DESCRIPTION = ("Run a labeled manifest's gang on this machine, as a cluster would: the real webhook admits the "
               "objects, the controllers are emulated, every pod gets its own network namespace (needs root).")


class Interrupted(Exception):
    def __init__(self, code: int):
        super().__init__(f"interrupted (exit {code})")
        self.code = code


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = parser.description or DESCRIPTION
    parser.epilog = ("While a run runs: `trainhook local scale [RUN_DIR] statefulset/NAME --replicas N` scales a "
                     "StatefulSet as kubectl scale would, `trainhook local delete [RUN_DIR] pod/NAME` deletes a pod "
                     "(see docs/use/local.md).")
    parser.add_argument("manifest", help="YAML file with Services, StatefulSets, Jobs, Pods, ConfigMaps ('-': stdin)")
    parser.add_argument("-n", "--namespace", help="namespace of objects that name none (default: default)")
    parser.add_argument("--dry-run", action="store_true",
                        help="only admit the objects and print the mutated pods as YAML; run nothing")
    parser.add_argument("--timeout", type=float, metavar="SECONDS", help="stop every pod after this long (exit 124)")
    parser.add_argument("--grace-period", type=float, metavar="SECONDS",
                        help="SIGTERM-to-SIGKILL delay when stopping pods (default: each pod's "
                             "terminationGracePeriodSeconds, 30 when unset)")
    parser.add_argument("--workdir", type=Path, metavar="DIR",
                        help="keep the run's files (logs, hosts files, volumes, webhook log) in DIR")
    parser.add_argument("--keep-dir", action="store_true", help="keep the temporary run directory and print its path")
    parser.add_argument("--cluster-domain", default=os.environ.get("TRAINHOOK_WEBHOOK_CLUSTER_DOMAIN", "cluster.local"),
                        help="the DNS domain pods resolve each other under (default cluster.local)")


def _say(message: str) -> None:
    print(f"trainhook local: {message}", file=sys.stderr, flush=True)


def _warn(message: str) -> None:
    print(f"Warning: {message}", file=sys.stderr, flush=True)


def _raise_interrupted(signum: int, frame: object) -> None:
    raise Interrupted(128 + signum)


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """Hold SIGINT/SIGTERM while cleaning up; they are delivered (and handled) right after."""
    held = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, held)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    minutes, secs = divmod(seconds, 60)
    return f"{int(minutes)}m{secs:04.1f}s" if minutes else f"{secs:.1f}s"


def summary_table(result: RunResult) -> str:
    rows = [("POD", "RANK", "EXIT", "DURATION", "STATUS")]
    for pod in result.pods:
        code = pod.exit_code
        rows.append((pod.name, pod.rank or "-", "-" if code is None else str(code), _duration(pod.duration),
                     pod.shown_status(result.gangs)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    verdict = ("succeeded" if result.exit_code == 0 else
               f"failed: {result.first_failure}" if result.reason == "Failed" else f"stopped: {result.first_failure}")
    return "\n".join(lines + [f"run {verdict} (exit {result.exit_code})"])


def failing_pod(result: RunResult) -> str:
    """The pod whose failure decided the run ("" when it succeeded or nothing names one)."""
    if result.exit_code == 0:
        return ""
    for outcome in result.gangs.values():
        if outcome.get("phase") != "Succeeded" and outcome.get("pod"):
            return str(outcome["pod"])
    named = result.first_failure.split("/", 1)[0]
    return named if any(pod.name == named for pod in result.pods) else ""


def where_to_look(result: RunResult, kept: Path | None) -> str:
    """The closing line: where the run's logs and outcome are, the failing pod's first. A temporary run directory
    is removed at exit, so without --keep-dir/--workdir the terminal is the only place, and the line says so."""
    failing = failing_pod(result)
    if kept is None:
        where = "logs: printed above, each line prefixed with its pod"
        where += f" (the failing pod's lines start [{failing}])" if failing else ""
        return where + ("; not kept: --keep-dir or --workdir DIR keeps every container's log and outcome.json")
    where = f"logs: {kept}/logs/POD/CONTAINER.log"
    where += f" (the failing pod's: {kept}/logs/{failing}/)" if failing else ""
    return where + f"; outcome: {kept}/outcome.json"


def _run(args: argparse.Namespace, run_dir: Path, kept: Path | None) -> int:
    """Admit, run and summarize; `kept` is the run directory when it outlives the run (--workdir, --keep-dir)."""
    manifest = load_manifest(args.manifest, args.namespace)
    if manifest.ignored:
        _warn(f"ignored (a local run emulates Services, StatefulSets, Jobs, Pods, ConfigMaps and Secrets only): "
              f"{', '.join(manifest.ignored)}")
    if not manifest.workloads:
        raise ManifestError(f"{manifest.path}: no StatefulSet, Job or Pod to run")
    if not args.dry_run:
        check_host()  # refuse before doing any work
    env = dict(os.environ, TRAINHOOK_WEBHOOK_CLUSTER_DOMAIN=args.cluster_domain)
    # The webhook serves the whole run: a scale-up (`trainhook local scale`) admits its new pods through it.
    # It serves the notary too, with the local authority over this run's files (webhook/notary/local.py).
    with WebhookServer(run_dir / "webhook", env, notary_dir=run_dir) as webhook:
        client = webhook.client(manifest.path)
        state = admit_manifest(manifest, client, _warn)
        store_workloads(run_dir, state.workloads)  # where the notary reads them, as from the API server
        for message in address_warnings(state):
            _warn(message)
        (run_dir / "pods.yaml").write_text(pods_yaml(state.pods))
        if args.dry_run:
            sys.stdout.write(pods_yaml(state.pods))
            return 0
        network = Network()
        relay = None
        try:
            network.open()
            # The pods' way to the notary: the bridge's NOTARY_PORT, relayed to the webhook's notary listener.
            relay = NotaryRelay(network.listen_on_switch(NOTARY_PORT), webhook.notary_port)
            relay.start()
            files = (f"run files in {run_dir}" if kept is not None else
                     "run files in a temporary directory removed at exit (--keep-dir keeps it)")
            _say(f"run {network.run_id}: pod network {network.subnet} (isolated: nothing routes out), network "
                 f"namespaces {network.switch[:-2]}*, {files}")
            pods = prepare_pods(state, manifest, network, run_dir, args.cluster_domain)
            _say(f"starting {len(pods)} pod(s); images are not pulled: each container's command runs on this "
                 f"machine with the current Python environment ({sys.executable})")
            scaler = Scaler(state, manifest, network, client, run_dir, args.cluster_domain, _warn)
            result = run_pods(pods, run_dir, args.timeout, args.grace_period, scaler=scaler)
        finally:
            with deferred_signals():
                signal.signal(signal.SIGTERM, _raise_interrupted)  # asyncio restores the default on its way out
                if relay is not None:
                    relay.close()
                for error in network.close():
                    _warn(f"cleanup: {error}")
    print(summary_table(result), flush=True)
    print(where_to_look(result, kept), flush=True)
    return result.exit_code


def main(args: argparse.Namespace) -> int:
    previous = signal.signal(signal.SIGTERM, _raise_interrupted)
    temporary = args.workdir is None
    run_dir = Path(tempfile.mkdtemp(prefix="trainhook-local-")) if temporary else args.workdir
    run_dir.mkdir(parents=True, exist_ok=True)
    code = 1
    try:
        code = _run(args, run_dir, None if temporary and not args.keep_dir else run_dir)
    except (ManifestError, ControllerError, EnvError, NetworkError) as e:
        print(f"error: {e}", file=sys.stderr)
        code = 1
    except AdmissionError as e:
        print(str(e), file=sys.stderr)
        code = 1
    except KeyboardInterrupt:
        _say("interrupted")
        code = 130
    except Interrupted as e:
        _say(str(e))
        code = e.code
    finally:
        signal.signal(signal.SIGTERM, previous)
        if temporary and not args.keep_dir:
            shutil.rmtree(run_dir, ignore_errors=True)
        else:
            _say(f"run files kept in {run_dir}")
    return code


def _standalone() -> int:
    parser = argparse.ArgumentParser(prog="trainhook local")
    add_arguments(parser)
    return main(parser.parse_args())


if __name__ == "__main__":
    sys.exit(_standalone())
