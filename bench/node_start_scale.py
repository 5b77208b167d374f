"""Gang start at scale on the real node (issue 26): bare gangs of 2 to 64 pods, trainhook against hand-wired, in
both of trainhook's delivery paths, with the DNS queries each gang cost and the kubelet's own timestamps.

bench/node_start.py measures torch gangs of up to 8 pods, where 2N torch imports on 2 cores hide the start itself.
Here the ranks run plain Python (print the time, sleep: `--workload bare` of node_start.py), so what is measured is
the start: scheduling, sandboxes, containers, and trainhook's webhook, launcher and gang wait. Three variants, in
an order that rotates every round so a change of the machine's load falls on all alike:
- `configmap`: trainhook in `default`, one of the chart's trainingNamespaces: the launcher from the webhook's
  ConfigMap, no init container, the launcher's barrier (every member joins rank 0's coordinator) is the gang wait;
- `init`: trainhook in a namespace outside them (`bench-init`): the gang-wait init container delivers the launcher
  and waits (launcher/wait/command.py), then the barrier;
- `init-nowait`: `init` with `trainhook.dev/gang-wait: none`: the init container only delivers, and the launcher's
  barrier is the gang wait, as in the ConfigMap path (run it with `--variants`; not in the default set);
- `by-hand`: the same StatefulSet unlabeled, its variables written by hand: no webhook, no launcher, no wait;
- `by-hand-forms` (issue 32's fair baseline): the same hand-wired pods, whose program first forms the gang itself
  as a hand-written rendezvous does (FORMS: rank 0 listens on MASTER_ADDR:MASTER_PORT and accepts the N-1 others,
  which resolve and connect, retrying every 0.1 s; once all are in, rank 0 says so to each), then prints: what
  trainhook's barrier does, without trainhook. Pairs against it say what trainhook adds beyond forming the gang.
- `forms-volumes` and `forms-onevolume` (diagnostic baselines, `--variants` only): `by-hand-forms` with the volumes
  the ConfigMap path gives each pod (the launcher ConfigMap and the identity token's projection, whose
  TokenRequest the kubelet makes for each pod), as two volumes the way the webhook adds them, or as one projected
  volume holding both; nothing reads them. They tell the kubelet's share of the ConfigMap path's time from the
  launcher's.
The pods request 10m CPU and 16Mi (64 of them fit the 2-core node; hack/node_config.py's maxPods is 250).

Per round: "apply -> the last rank printed" (each rank prints time.time(): one clock for the node and this
process), the DNS queries whose name contains the gang's name (hack/cluster_dns.py counts them), and, from the
pods' status, the kubelet's timestamps (seconds): the last pod created, scheduled, its init container finished,
its training container started. Results: bench/results/node_start_scale_<size>.json, one file per size, so the
sizes can be run one at a time (the node is shared: hold its lock a size at a time), and `--summary` reads them all.

    python bench/node_start_scale.py --sizes 8 --rounds 3      (root; starts the node if it is not up)
    python bench/node_start_scale.py --summary
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import node_cpu  # noqa: E402  (bench/ is not a package)
import node_start  # noqa: E402

VARIANTS = ("configmap", "init", "init-nowait", "by-hand", "by-hand-forms", "forms-volumes", "forms-onevolume")
WITH_VOLUMES = ("forms-volumes", "forms-onevolume")  # the forming gang with the ConfigMap path's volumes
DIAGNOSTIC = ("init-nowait", *WITH_VOLUMES)  # not in the default set
NAMESPACES = {"configmap": "default", "init": "bench-init", "init-nowait": "bench-init", "by-hand": "default",
              "by-hand-forms": "default", "forms-volumes": "default", "forms-onevolume": "default"}
SHORT = {"configmap": "conf", "init": "init", "init-nowait": "inow", "by-hand": "hand",
         "by-hand-forms": "form", "forms-volumes": "fvol", "forms-onevolume": "fone"}  # in the gang's name
BASELINES = ("by-hand", "by-hand-forms", *WITH_VOLUMES)
FORMING = ("by-hand-forms", *WITH_VOLUMES)

# by-hand-forms' rank program (python -c): the gang formed over TCP, then node_start's GANGSTART line. A barrier
# like trainhook's: no rank prints before every member has connected to rank 0.
FORMS = """import os, socket, time
rank, size = int(os.environ["HOSTNAME"].rsplit("-", 1)[1]), int(os.environ["WORLD_SIZE"])
where = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
if rank == 0:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("", where[1]))
    server.listen(size)
    members = [server.accept()[0] for _ in range(size - 1)]
    for member in members:
        member.sendall(b"go")
else:
    while True:
        try:
            link = socket.create_connection(where, timeout=5)
            break
        except OSError:
            time.sleep(0.1)
    link.settimeout(None)  # the gang may take longer than 5 s to gather (64 pods): wait, as a rendezvous does
    assert link.recv(2) == b"go"
print(f"GANGSTART rank={rank} imported={time.time():.6f} process_group=0 loop={time.time():.6f}", flush=True)
time.sleep(60)
"""
OUT = ROOT / "bench" / "results"


def load_hack(name: str):
    spec = importlib.util.spec_from_file_location(f"trainhook_hack_{name}", ROOT / "hack" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # before running it: its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


cluster_dns = load_hack("cluster_dns")
node_config = node_start.load_node().cfg  # hack/node_config.py, as hack/node.py imports it


def trainhook_volumes(variant: str, launcher_configmap: str) -> tuple[list[dict], list[dict]]:
    """The ConfigMap path's volumes and mounts (webhook/admission/delivery.py), as the webhook adds them
    (`forms-volumes`) or merged into one projected volume mounted at both paths (`forms-onevolume`)."""
    launcher = {"configMap": {"name": launcher_configmap, "items": [
        {"key": "launcher.pyz", "path": "launcher.pyz", "mode": 0o444},
        {"key": "trainhook-launch", "path": "bin/trainhook-launch", "mode": 0o555}]}}
    token = {"serviceAccountToken": {"audience": "trainhook", "expirationSeconds": 3600, "path": "token"}}
    paths = {"trainhook-launcher": "/trainhook", "trainhook-identity": "/var/run/secrets/trainhook.dev/identity"}
    if variant == "forms-volumes":
        volumes = [{"name": "trainhook-launcher", **launcher},
                   {"name": "trainhook-identity", "projected": {"sources": [token]}}]
        return volumes, [{"name": n, "mountPath": p, "readOnly": True} for n, p in paths.items()]
    volumes = [{"name": "trainhook-both", "projected": {"sources": [launcher, token]}}]
    return volumes, [{"name": "trainhook-both", "mountPath": p, "readOnly": True} for p in paths.values()]


def gang(variant: str, name: str, size: int, image: str, launcher_configmap: str = "") -> list[dict]:
    """node_start's bare gang (trainhook-labeled or wired by hand), with tiny requests; the forming baselines'
    pods run FORMS."""
    docs = node_start.manifests("by-hand" if variant in BASELINES else "trainhook", name, size, image, "bare")
    for doc in docs:
        if doc["kind"] == "StatefulSet":
            spec = doc["spec"]["template"]["spec"]
            for container in spec["containers"]:
                container["resources"] = {"requests": {"cpu": "10m", "memory": "16Mi"}}
                if variant in FORMING:
                    container["command"] = ["python", "-c", FORMS]
                if variant in WITH_VOLUMES:
                    volumes, mounts = trainhook_volumes(variant, launcher_configmap)
                    spec["volumes"] = spec["volumes"] + volumes
                    container["volumeMounts"] = container["volumeMounts"] + mounts
            if variant == "init-nowait":
                template = doc["spec"]["template"]["metadata"]
                template.setdefault("annotations", {})["trainhook.dev/gang-wait"] = "none"
    return docs


def seconds(stamp: str | None) -> float | None:
    if not stamp:
        return None
    return dt.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc).timestamp()


def kubelet_times(pods: list[dict], start: float) -> dict:
    """The last pod's moment of each step, in seconds after `start` (the API's timestamps have 1 s resolution)."""
    steps: dict[str, list[float]] = {"created": [], "scheduled": [], "init_finished": [], "trainer_started": []}
    for pod in pods:
        steps["created"].append(seconds(pod["metadata"].get("creationTimestamp")))
        scheduled = [c for c in pod["status"].get("conditions") or [] if c["type"] == "PodScheduled"]
        steps["scheduled"].append(seconds(scheduled[0].get("lastTransitionTime")) if scheduled else None)
        for status in pod["status"].get("initContainerStatuses") or []:
            steps["init_finished"].append(seconds((status["state"].get("terminated") or {}).get("finishedAt")))
        for status in pod["status"].get("containerStatuses") or []:
            steps["trainer_started"].append(seconds((status["state"].get("running") or {}).get("startedAt")))
    return {key: round(max(v for v in values if v is not None) - start, 1) if any(v is not None for v in values)
            else None for key, values in steps.items()}


def pods_of(node: node_start.Node, namespace: str, name: str) -> list[dict]:
    return json.loads(node.kubectl("get", "pods", "-n", namespace, "-l", f"app={name}", "-o", "json",
                                   check=False) or '{"items": []}')["items"]


def one_round(node: node_start.Node, variant: str, size: int, timeout: float = 300) -> dict:
    namespace = NAMESPACES[variant]
    name = f"sc-{SHORT[variant]}-{size}-{uuid.uuid4().hex[:4]}"
    launcher_configmap = ""
    if variant in WITH_VOLUMES:  # the one the webhook made (it delivers the launcher)
        names = node.kubectl("get", "configmaps", "-n", namespace, "-o", "name").split()
        launcher_configmap = next(n.split("/", 1)[1] for n in names if n.startswith("configmap/trainhook-launcher-"))
    docs = gang(variant, name, size, node.images["torch"], launcher_configmap)
    state_dir = str(node.state_dir)
    cpu_before = node_cpu.snapshot(state_dir, node_config.CGROUP_ROOT)
    start = time.time()
    node.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                                      "items": docs}))
    printed: dict[int, float] = {}
    try:
        deadline = time.monotonic() + timeout
        while len(printed) < size:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name}: only {len(printed)} of {size} ranks printed in {timeout:.0f}s")
            time.sleep(1.0)
            pods = pods_of(node, namespace, name)
            running = {p["metadata"]["name"] for p in pods
                       if any("running" in s["state"] for s in p["status"].get("containerStatuses") or [])}
            for i in range(size):  # a pod's log is read once its container runs, until its line is there
                if i not in printed and f"{name}-{i}" in running:
                    log = node.kubectl("logs", "-n", namespace, f"{name}-{i}", "-c", "trainer", check=False)
                    for match in node_start.GANGSTART.findall(log):
                        printed[int(match[0])] = float(match[3])
        time.sleep(2.0)  # the launchers' last lookups land (the bare ranks resolve nothing)
        queries = cluster_dns.query_counts(node_config.host_ip(), 53, containing=name)
        pods = pods_of(node, namespace, name)
        cpu = node_cpu.parts(cpu_before, node_cpu.snapshot(state_dir, node_config.CGROUP_ROOT),
                             {p["metadata"]["uid"] for p in pods})
    finally:
        node_start_delete(node, namespace, name)
    return {"variant": variant, "size": size, "load_1m": round(os.getloadavg()[0], 2),
            "to_last_rank_s": round(max(printed.values()) - start, 3),
            "to_first_rank_s": round(min(printed.values()) - start, 3),
            "dns_queries": queries["queries"], "dns_nxdomain": queries["nxdomain"],
            "dns_top": dict(list(queries["top"].items())[:6]),  # which names were asked most: who asks
            "kubelet": kubelet_times(pods, start), "cpu_s": cpu}


def node_start_delete(node: node_start.Node, namespace: str, name: str) -> None:
    node.kubectl("delete", "-n", namespace, "statefulset,service,configmap", name, f"{name}-script",
                 "--ignore-not-found", "--wait=false", check=False)
    node.kubectl("delete", "pods", "-n", namespace, "-l", f"app={name}", "--grace-period=0", "--force",
                 "--ignore-not-found", check=False)
    gone_by = time.monotonic() + 180
    while pods_of(node, namespace, name):
        if time.monotonic() > gone_by:
            raise RuntimeError(f"{name}: pods still there 180 s after the delete")
        time.sleep(1.0)


def ensure_namespace(node: node_start.Node, namespace: str) -> None:
    if namespace == "default" or node.kubectl("get", "namespace", namespace, check=False).strip():
        return
    node.kubectl("create", "namespace", namespace)
    for _ in range(60):  # its default ServiceAccount, which its pods wait for
        if node.kubectl("get", "serviceaccount", "default", "-n", namespace, check=False).strip():
            return
        time.sleep(0.5)


def summarize(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 2), "min": round(min(values), 2),
            "max": round(max(values), 2), "n": len(values)}


def summary(rounds: list[dict]) -> dict:
    out: dict = {}
    for size in sorted({r["size"] for r in rounds}):
        done = [r for r in rounds if r["size"] == size and "failed" not in r]
        entry: dict = {}
        for variant in VARIANTS:
            mine = [r for r in done if r["variant"] == variant]
            if not mine:
                continue
            entry[variant] = {"to_last_rank_s": summarize([r["to_last_rank_s"] for r in mine]),
                              "dns_queries": summarize([r["dns_queries"] for r in mine]),
                              "load_1m": summarize([r["load_1m"] for r in mine]),
                              "kubelet_median": {k: statistics.median(v for v in (r["kubelet"][k] for r in mine)
                                                                      if v is not None)
                                                 if any(r["kubelet"][k] is not None for r in mine) else None
                                                 for k in mine[0]["kubelet"]},
                              "cpu_s_median": {k: round(statistics.median(r["cpu_s"][k] for r in mine if k in r.get(
                                  "cpu_s", {})), 2) for k in mine[0].get("cpu_s", {})}}
        for variant in ("configmap", "init", "init-nowait", *WITH_VOLUMES):
            mine = [r for r in done if r["variant"] == variant]
            for baseline, suffix in (("by-hand", ""), ("by-hand-forms", "_over_forms")):
                hand = [r for r in done if r["variant"] == baseline]
                if mine and hand:
                    entry[variant].update(pairs_against(mine, hand, size, suffix))
        entry["failed"] = sum(1 for r in rounds if r["size"] == size and "failed" in r)
        out[str(size)] = entry
    return out


def pairs_against(mine: list[dict], hand: list[dict], size: int, suffix: str) -> dict:
    """A trainhook variant's rounds against a baseline's: the medians' difference, and each round's gang against
    the same round's baseline (time, and the CPU seconds of the gang's pods and of the whole node: in all, and per
    pod in ms, what trainhook adds to each pod's start)."""
    out = {f"overhead_median_s{suffix}": round(statistics.median(r["to_last_rank_s"] for r in mine)
                                               - statistics.median(r["to_last_rank_s"] for r in hand), 2)}
    by_round = {r["round"]: r for r in hand if "round" in r}
    paired = [(r, by_round[r["round"]]) for r in mine if r.get("round") in by_round]
    if paired:
        out[f"pair_overhead_s{suffix}"] = summarize([r["to_last_rank_s"] - h["to_last_rank_s"] for r, h in paired])
        for part in ("gang_pods", "total"):
            extra = [r["cpu_s"][part] - h["cpu_s"][part] for r, h in paired if part in r.get("cpu_s", {})
                     and part in h.get("cpu_s", {})]
            if extra:
                out[f"pair_cpu_s_{part}{suffix}"] = summarize(extra)
                out[f"pair_cpu_ms_per_pod_{part}{suffix}"] = round(statistics.median(extra) * 1000 / size, 1)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="2,8,32,64")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variants", default=",".join(v for v in VARIANTS if v not in DIAGNOSTIC))
    parser.add_argument("--no-warmup", action="store_true", help="skip the unmeasured first round of each variant")
    parser.add_argument("--summary", action="store_true", help="only summarize the result files there are")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    out = Path(args.out)
    if args.summary:
        rounds = [r for f in sorted(out.glob("node_start_scale_*.json")) for r in json.loads(f.read_text())["rounds"]]
        print(json.dumps(summary(rounds), indent=1))
        return 0
    variants = [v for v in args.variants.split(",") if v]
    node_mod = sys.modules["trainhook_hack_node"]
    running, started = node_mod.ensure_up(node_mod.default_state_dir())
    node = node_start.Node(running)
    try:
        node_start.install_chart(node)
        for namespace in {NAMESPACES[v] for v in variants}:
            ensure_namespace(node, namespace)
        for size in [int(s) for s in args.sizes.split(",")]:
            results = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count()}, "rounds": []}
            if not args.no_warmup:
                for variant in variants:
                    one_round(node, variant, size)
            for r in range(args.rounds):
                order = variants[r % len(variants):] + variants[:r % len(variants)]  # rotate who goes first
                for variant in order:
                    try:
                        figures = one_round(node, variant, size)
                    except RuntimeError as e:  # kept, said, not timed
                        figures = {"variant": variant, "size": size, "failed": str(e)[:2000]}
                    figures["round"] = r
                    results["rounds"].append(figures)
                    print(json.dumps(figures), flush=True)
            results["summary"] = summary(results["rounds"])
            print(json.dumps(results["summary"], indent=1), flush=True)
            out.mkdir(parents=True, exist_ok=True)
            (out / f"node_start_scale_{size}.json").write_text(json.dumps(results, indent=1))
    finally:
        if started:
            node_mod.ensure_down(node_mod.default_state_dir())
    return 0


if __name__ == "__main__":
    sys.exit(main())
