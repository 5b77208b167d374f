"""Gang-start benchmark: from the last pod's start to every rank inside its training loop, for N local pods.

Two ways of starting the same gang of `torchrun bench/gang_train.py` (gloo, one tiny step), in alternation:
- trainhook: `trainhook local` on a headless Service and an N-replica StatefulSet labeled for trainhook: the real
  webhook admits everything, every pod gets its network namespace, hosts file and hostname, runs the injected
  gang-wait init container (`trainhook-launch wait`), then `torchrun SCRIPT` with the injected PET_* variables.
- torchrun by hand: the same N network namespaces and hosts files (trainhook.local.network), the same way into
  each (LocalPod.entry_argv: nsenter, unshare, podinit), and N `torchrun --nnodes N --node-rank I --master-addr
  gs-0.gs ...` processes started directly with the same addresses and environment: no webhook, no gang wait.

Timestamps are wall-clock (time.time(), one clock for every process here). A pod starts when its first process
is spawned: for `trainhook local` this is observed by running its real CLI in a child process whose
`asyncio.create_subprocess_exec` is wrapped to note the time and argv of every spawn (nothing in trainhook/local
is changed); by hand, the benchmark notes it itself. A rank is in its loop when gang_train.py prints so.

    python bench/gang_start.py [--runs 8] [--pods 8] [--out bench/results]     (root: network namespaces)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trainhook.local.pods import PODINIT

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "gang_train.py"
JOB, NAMESPACE, PORT = "gs", "default", 23456
RUN_TIMEOUT = 600
LINE = re.compile(r"GANGSTART rank=(\d+) imported=([\d.]+) process_group=([\d.]+) loop=([\d.]+)")
CHILD = "_traced-local"  # internal: `gang_start.py _traced-local EVENTS -- ARGS` runs `trainhook local ARGS`

MANIFEST = """\
apiVersion: v1
kind: Service
metadata:
  name: {job}
  labels: {{trainhook.dev/job-name: {job}}}
spec:
  clusterIP: None
  selector: {{trainhook.dev/job-name: {job}}}
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: {job}
  labels: {{trainhook.dev/framework: pytorch}}
spec:
  serviceName: {job}
  replicas: {pods}
  selector:
    matchLabels: {{app: {job}}}
  template:
    metadata:
      labels: {{app: {job}, trainhook.dev/framework: pytorch}}
    spec:
      containers:
        - name: trainer
          image: pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime
          command: ["torchrun", "{script}"]
"""


# --- trainhook local, traced --------------------------------------------------------------------------------

def traced_local(events_file: str, args: list[str]) -> int:
    """Run the real `trainhook local ARGS`, noting (time, argv) of every process its runner spawns."""
    events: list[dict] = []
    spawn = asyncio.create_subprocess_exec

    async def traced(*argv, **kwargs):
        events.append({"t": time.time(), "argv": [str(a) for a in argv]})
        return await spawn(*argv, **kwargs)

    asyncio.create_subprocess_exec = traced
    from trainhook.cli import main
    try:
        return main(["local", *args])
    finally:
        Path(events_file).write_text(json.dumps(events))


def pod_command(argv: list[str]) -> tuple[str, list[str]]:
    """(hostname, command) of a spawn through LocalPod.entry_argv; ("", []) for anything else."""
    if PODINIT not in argv:
        return "", []
    rest = argv[argv.index(PODINIT):]
    return rest[rest.index("--hostname") + 1], rest[rest.index("--") + 1:]


def loop_lines(text: str) -> dict[int, dict]:
    ranks = {}
    for match in LINE.finditer(text):
        ranks[int(match[1])] = {"imported": float(match[2]), "process_group": float(match[3]),
                                "loop": float(match[4])}
    return ranks


def run_trainhook(pods: int, workdir: Path) -> dict:
    manifest = workdir / "gang.yaml"
    manifest.write_text(MANIFEST.format(job=JOB, pods=pods, script=SCRIPT))
    events_file = workdir / "spawns.json"
    command = [sys.executable, __file__, CHILD, str(events_file), "--", str(manifest), "--workdir",
               str(workdir / "run"), "--timeout", str(RUN_TIMEOUT), "--grace-period", "2"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT + 60)
    ranks = loop_lines(done.stdout)
    if len(ranks) < pods:
        raise RuntimeError(f"trainhook local exited {done.returncode}, ranks in their loop: {sorted(ranks)}:\n"
                           f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    starts: dict[str, float] = {}
    mains: dict[str, float] = {}
    for event in json.loads(events_file.read_text()):
        host, cmd = pod_command(event["argv"])
        if not host:
            continue
        starts.setdefault(host, event["t"])  # the pod's first process: its gang-wait init container
        if cmd and cmd[0] == "torchrun":
            mains[host] = event["t"]
    failed = "" if done.returncode == 0 else (f"trainhook local exited {done.returncode}; its last words:\n"
                                              + "\n".join((done.stdout + done.stderr).strip().splitlines()[-12:]))
    return {"starts": starts, "mains": mains, "ranks": ranks, "failed": failed}


# --- torchrun by hand -----------------------------------------------------------------------------------------

def run_by_hand(pods: int, workdir: Path) -> dict:
    from trainhook.local.envvars import base_env
    from trainhook.local.network import HostEntry, Network, hosts_file
    from trainhook.local.pods import ContainerSpec, LocalPod

    master = f"{JOB}-0.{JOB}"
    with Network() as network:
        nets = [network.add_pod() for _ in range(pods)]
        entries = [HostEntry(net.ip, f"{JOB}-{i}", JOB, NAMESPACE) for i, net in enumerate(nets)]
        launches = []
        for i, (net, entry) in enumerate(zip(nets, entries)):
            pod_dir = workdir / f"{JOB}-{i}"
            pod_dir.mkdir(parents=True)
            hosts = pod_dir / "hosts"
            hosts.write_text(hosts_file(entry, entries))
            env = {**base_env(entry.hostname), "MASTER_ADDR": master, "MASTER_PORT": str(PORT),
                   "WORLD_SIZE": str(pods), "RANK": str(i), "PET_MASTER_ADDR": master,
                   "PET_MASTER_PORT": str(PORT), "PET_NNODES": str(pods), "PET_NODE_RANK": str(i),
                   "PET_NPROC_PER_NODE": "1", "PYTHONUNBUFFERED": "1"}
            command = ["torchrun", "--nnodes", str(pods), "--node-rank", str(i), "--nproc-per-node", "1",
                       "--master-addr", master, "--master-port", str(PORT), str(SCRIPT)]
            spec = ContainerSpec("trainer", "main", command, env, training=True)
            pod = LocalPod(entry.hostname, NAMESPACE, entry.hostname, net.ip, net.netns_path, str(hosts), [], [spec])
            launches.append((entry.hostname, pod.entry_argv(spec), env, pod_dir / "log"))
        starts, processes = {}, []
        for host, argv, env, log in launches:
            starts[host] = time.time()
            processes.append(subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log.open("wb"),
                                              stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.monotonic() + RUN_TIMEOUT
        try:
            for process in processes:
                process.wait(max(1.0, deadline - time.monotonic()))
        finally:
            for process in processes:
                if process.poll() is None:
                    os.killpg(process.pid, 9)
                    process.wait()
        codes = [p.returncode for p in processes]
    text = "".join((workdir / f"{JOB}-{i}" / "log").read_text() for i in range(pods))
    ranks = loop_lines(text)
    if len(ranks) < pods:
        raise RuntimeError(f"torchrun by hand: exit codes {codes}, ranks in their loop: {sorted(ranks)}\n"
                           f"{text[-4000:]}")
    failed = f"exit codes {codes}; the last words:\n{text[-1500:]}" if any(codes) else ""
    return {"starts": starts, "mains": starts, "ranks": ranks, "failed": failed}


# --- one run's figures ----------------------------------------------------------------------------------------

def figures(raw: dict, pods: int) -> dict:
    starts, ranks = raw["starts"], raw["ranks"]
    if len(starts) != pods or len(ranks) != pods:
        raise RuntimeError(f"expected {pods} pods and ranks, got {len(starts)} pods and {len(ranks)} ranks")
    last_start, last_main = max(starts.values()), max(raw["mains"].values())
    loops = [r["loop"] for r in ranks.values()]
    waits = [raw["mains"][h] - starts[h] for h in starts]
    return {
        "gang_start_s": max(loops) - last_start,  # the headline: last pod started -> every rank in its loop
        # Split at the last training container's start: before it, what trainhook adds (its init container;
        # 0 by hand); after it, the same torchrun command in both.
        "last_main_start_s": last_main - last_start,
        "main_to_loop_s": max(loops) - last_main,
        "start_spread_s": last_start - min(starts.values()),
        "first_rank_in_loop_s": min(loops) - last_start,
        "last_import_s": max(r["imported"] for r in ranks.values()) - last_start,
        "last_process_group_s": max(r["process_group"] for r in ranks.values()) - last_start,
        "init_to_main_s": {"median": statistics.median(waits), "max": max(waits)},  # 0 by hand: no init container
        # Every rank reached its loop, but the run did not end cleanly (kept: the start is what is measured);
        # why, in the run's own words ("" when it ended cleanly).
        "failed_after_start": raw["failed"],
    }


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values),
            "values": values}


def machine() -> dict:
    import aiohttp
    import torch
    return {"python": platform.python_version(), "torch": torch.__version__, "aiohttp": aiohttp.__version__,
            "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "kernel": platform.release(),
            "loadavg_at_start": os.getloadavg()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8, help="measured runs of each (after one warm-up of each)")
    parser.add_argument("--pods", type=int, default=8)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("gang_start.py needs root (network namespaces), as `trainhook local` does")
    variants = {"trainhook": run_trainhook, "torchrun": run_by_hand}
    results = {"machine": machine(), "pods": args.pods, "runs": {name: [] for name in variants}}
    for round_ in range(args.runs + 1):  # round 0 warms the page cache (torch's import) and is not kept
        order = list(variants) if round_ % 2 else list(reversed(variants))  # alternate who goes first
        for name in order:
            workdir = Path(tempfile.mkdtemp(prefix=f"trainhook-gang-{name}-"))
            try:
                figs = figures(variants[name](args.pods, workdir), args.pods)
            finally:
                shutil.rmtree(workdir, ignore_errors=True)
            print(f"round {round_}{' (warm-up)' if round_ == 0 else ''} {name:9s} "
                  f"gang start {figs['gang_start_s']:.3f}s (pods started over {figs['start_spread_s']:.3f}s, "
                  f"last training container started {figs['last_main_start_s']:.3f}s after the last pod, "
                  f"then {figs['main_to_loop_s']:.3f}s to every rank in its loop)", flush=True)
            if figs["failed_after_start"]:
                print(f"  (this {name} run did not end cleanly after every rank reached its loop: "
                      f"{figs['failed_after_start']})", flush=True)
            if round_:
                results["runs"][name].append(figs)
    th, tr = ([r["gang_start_s"] for r in results["runs"][n]] for n in variants)
    results["summary"] = {
        "trainhook_gang_start_s": spread(th),
        "torchrun_gang_start_s": spread(tr),
        "overhead_of_medians_s": statistics.median(th) - statistics.median(tr),
        "paired_overhead_s": spread([a - b for a, b in zip(th, tr)]),  # same round, back to back
        "trainhook_init_to_main_s": spread([r["init_to_main_s"]["median"] for r in results["runs"]["trainhook"]]),
        "trainhook_last_main_start_s": spread([r["last_main_start_s"] for r in results["runs"]["trainhook"]]),
        "trainhook_main_to_loop_s": spread([r["main_to_loop_s"] for r in results["runs"]["trainhook"]]),
        "torchrun_main_to_loop_s": spread([r["main_to_loop_s"] for r in results["runs"]["torchrun"]]),
        "runs_not_ending_cleanly": {n: sum(bool(r["failed_after_start"]) for r in results["runs"][n])
                                    for n in variants},
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gang_start.json").write_text(json.dumps(results, indent=2))
    print(json.dumps(results["summary"], indent=2))


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == CHILD:
        sys.exit(traced_local(sys.argv[2], sys.argv[sys.argv.index("--") + 1:]))
    main()
