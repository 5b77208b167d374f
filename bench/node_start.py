"""Gang start on the real node (hack/node.py): from `kubectl apply` to every rank inside its training loop.

Two ways of running the same gang, in alternation, at each size (2, 4 and 8 pods by default):
- trainhook: a headless Service and an N-replica StatefulSet labeled `trainhook.dev/framework: pytorch` whose
  container runs `torchrun /workspace/gang_train.py` on the local torch image (Python and torch, nothing of
  trainhook): the webhook (installed by Helm, as the e2e tests install it) injects the PET_* variables, the
  gang-wait init container that delivers the launcher, and wraps the command in it.
- by hand: the same Service (publishNotReadyAddresses written by hand) and StatefulSet, unlabeled so the webhook
  leaves it alone, with the variables written into the manifest and torchrun's node rank taken from the pod's
  hostname (`--node-rank=${HOSTNAME##*-}`): no webhook, no init container, no launcher.

Same image, same script (bench/gang_train.py, from a ConfigMap), same requests (100m CPU: the node has 2 cores).
Timestamps are wall-clock (time.time()): the node is this machine, one clock for the benchmark and every
container. The gang is in its loop when the last rank prints GANGSTART; the time before `kubectl apply` is the
start. Between rounds everything is deleted and its pods waited out (not measured).

    python bench/node_start.py [--sizes 2,4,8] [--rounds 3] [--workload torch|bare] [--out bench/results]
    (root; starts the node if it is not up)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "gang_train.py"
NAMESPACE, PORT, HOLD = "default", 23456, "30"
GANGSTART = re.compile(r"GANGSTART rank=(\d+) imported=([0-9.]+) process_group=([0-9.]+) loop=([0-9.]+)")
VARIANTS = ("trainhook", "by-hand")


def load_node():
    spec = importlib.util.spec_from_file_location("trainhook_hack_node", ROOT / "hack" / "node.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


# ---- manifests (pure) ---------------------------------------------------------------------------------------------

# --workload bare: no torch, the "training" prints its timestamp at once: what is left is the start itself
# (scheduling, sandboxes, containers, and trainhook's webhook, launcher and barrier), without 2N torch imports
# fighting for the node's 2 cores.
BARE = ("import os, time; print(f'GANGSTART rank={os.environ[\"HOSTNAME\"].rsplit(\"-\", 1)[1]} "
        "imported={time.time():.6f} process_group=0 loop={time.time():.6f}', flush=True); time.sleep(60)")


def manifests(variant: str, name: str, size: int, image: str, workload: str = "torch") -> list[dict]:
    """The gang's ConfigMap, Service and StatefulSet, wired by trainhook's webhook or by hand."""
    trainhook = variant == "trainhook"
    container = {"name": "trainer", "image": image, "imagePullPolicy": "Never",
                 "command": ["torchrun", "/workspace/gang_train.py"],
                 "env": [{"name": "GANG_TRAIN_HOLD", "value": HOLD}],
                 "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                 "volumeMounts": [{"name": "script", "mountPath": "/workspace"}]}
    labels = {"app": name}
    service_spec = {"clusterIP": "None", "selector": {"app": name}}
    annotations = {}
    service_labels = {}
    if trainhook:  # the Service labeled with the gang's name: the webhook publishes its not-ready addresses
        labels["trainhook.dev/framework"] = "pytorch"
        service_labels["trainhook.dev/job-name"] = name
        annotations["trainhook.dev/port"] = str(PORT)
    else:
        master = f"{name}-0.{name}"
        container["command"] = ["sh", "-c", 'exec torchrun --node-rank="${HOSTNAME##*-}" /workspace/gang_train.py']
        container["env"] += [{"name": k, "value": v} for k, v in (
            ("MASTER_ADDR", master), ("MASTER_PORT", str(PORT)), ("WORLD_SIZE", str(size)),
            ("PET_MASTER_ADDR", master), ("PET_MASTER_PORT", str(PORT)), ("PET_NNODES", str(size)),
            ("PET_NPROC_PER_NODE", "1"), ("PYTHONUNBUFFERED", "1"))]
        service_spec["publishNotReadyAddresses"] = True
    if workload == "bare":
        container["command"] = ["python", "-c", BARE]
    return [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{name}-script"},
         "data": {"gang_train.py": SCRIPT.read_text()}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "labels": service_labels},
         "spec": service_spec},
        {"apiVersion": "apps/v1", "kind": "StatefulSet",
         "metadata": {"name": name, "labels": dict(labels), "annotations": annotations},
         "spec": {"serviceName": name, "replicas": size, "podManagementPolicy": "Parallel",
                  "selector": {"matchLabels": {"app": name}},
                  "template": {"metadata": {"labels": labels}, "spec": {
                      "terminationGracePeriodSeconds": 1, "containers": [container],
                      "volumes": [{"name": "script", "configMap": {"name": f"{name}-script"}}]}}}},
    ]


def summarize(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3), "n": len(values)}


# ---- running (I/O) ------------------------------------------------------------------------------------------------

class Node:
    """The running node as the benchmark uses it: kubectl with its kubeconfig, the images' references."""

    def __init__(self, running):
        self.env = {**os.environ, **running.env()}
        self.images = running.images
        self.state_dir = running.state_dir  # bench/node_cpu.py tells the node's processes by it
        self.kubectl_bin = str(Path(running.env()["PATH"].split(":")[0]) / "kubectl")

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        done = subprocess.run([self.kubectl_bin, *args], capture_output=True, text=True, env=self.env, input=input,
                              timeout=120)
        if check and done.returncode:
            raise RuntimeError(f"kubectl {' '.join(args)}: {done.stderr}")
        return done.stdout


def one_round(node: Node, variant: str, size: int, workload: str = "torch", timeout: float = 300) -> dict:
    name = f"bench-{'th' if variant == 'trainhook' else 'hand'}-{size}"
    docs = manifests(variant, name, size, node.images["torch"], workload)
    start = time.time()
    node.kubectl("apply", "-n", NAMESPACE, "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                                      "items": docs}))
    ranks: dict[int, tuple[float, float, float]] = {}
    try:
        deadline = time.monotonic() + timeout
        while len(ranks) < size:
            if time.monotonic() > deadline:
                logs = "".join(f"\n--- {name}-{i}\n" + node.kubectl("logs", "-n", NAMESPACE, f"{name}-{i}", "-c",
                                                                   "trainer", "--tail=15", check=False)
                               for i in range(size))
                pods = node.kubectl("get", "pods,events", "-n", NAMESPACE, check=False)
                raise RuntimeError(f"{name}: only ranks {sorted(ranks)} reached their loop in {timeout:.0f}s{logs}\n"
                                   f"{pods}")
            for i in range(size):  # one process per pod: pod i runs rank i, either way
                if i in ranks:
                    continue
                for match in GANGSTART.findall(node.kubectl("logs", "-n", NAMESPACE, f"{name}-{i}", "-c", "trainer",
                                                            check=False)):
                    ranks[int(match[0])] = tuple(float(x) for x in match[1:])
            time.sleep(0.5)
    finally:
        node.kubectl("delete", "-n", NAMESPACE, "statefulset,service,configmap", name, f"{name}-script",
                     "--ignore-not-found", "--wait=false", check=False)
        node.kubectl("delete", "pods", "-n", NAMESPACE, "-l", f"app={name}", "--grace-period=0", "--force",
                     "--ignore-not-found", check=False)
        gone_by = time.monotonic() + 120
        while node.kubectl("get", "pods", "-n", NAMESPACE, "-l", f"app={name}", "-o", "name", check=False).strip():
            if time.monotonic() > gone_by:
                raise RuntimeError(f"{name}: pods still there 120 s after the delete")
            time.sleep(0.5)
    imported = max(r[0] for r in ranks.values())
    loop = max(r[2] for r in ranks.values())
    return {"variant": variant, "size": size, "workload": workload, "load_1m": round(os.getloadavg()[0], 2),
            "to_loop_s": round(loop - start, 3),
            "to_last_import_s": round(imported - start, 3), "import_to_loop_s": round(loop - imported, 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="2,4,8")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workload", choices=("torch", "bare"), default="torch",
                        help="torch: bench/gang_train.py under torchrun; bare: print at once (the start alone)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    node_mod = load_node()
    running, started = node_mod.ensure_up(node_mod.default_state_dir())
    node = Node(running)
    try:
        install_chart(node)
        results = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count()}, "rounds": []}
        for size in sizes:
            one_round(node, "trainhook", size, args.workload)  # warm-up: page cache, the webhook's first reviews
            one_round(node, "by-hand", size, args.workload)
            for r in range(args.rounds):
                order = VARIANTS if r % 2 == 0 else VARIANTS[::-1]  # alternate who goes first
                for variant in order:
                    try:
                        figures = one_round(node, variant, size, args.workload)
                    except RuntimeError as e:  # a gang that never reached its loop: kept, said, not timed
                        figures = {"variant": variant, "size": size, "workload": args.workload, "failed": str(e)}
                    results["rounds"].append(figures)
                    print(json.dumps(figures), flush=True)
        results["summary"] = summary(results["rounds"], sizes)
        print(json.dumps(results["summary"], indent=1))
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"node_start_{args.workload}.json").write_text(json.dumps(results, indent=1))
    finally:
        if started:
            node_mod.ensure_down(node_mod.default_state_dir())
    return 0


def summary(rounds: list[dict], sizes: list[int]) -> dict:
    out = {}
    for size in sizes:
        done = [r for r in rounds if "failed" not in r]
        by = {v: [r["to_loop_s"] for r in done if r["size"] == size and r["variant"] == v] for v in VARIANTS}
        out[str(size)] = {v: summarize(values) for v, values in by.items()}
        out[str(size)]["overhead_median_s"] = round(statistics.median(by["trainhook"]) -
                                                    statistics.median(by["by-hand"]), 3)
        for key in ("to_last_import_s", "import_to_loop_s"):
            out[str(size)][key] = {v: round(statistics.median(r[key] for r in done if r["size"] == size and
                                                              r["variant"] == v), 3) for v in VARIANTS}
        out[str(size)]["failed"] = {v: sum(1 for r in rounds if "failed" in r and r["size"] == size and
                                           r["variant"] == v) for v in VARIANTS}
    return out


def install_chart(node: Node) -> None:
    """The chart as the e2e tests install it: the local images, never pulled, nothing else set."""
    helm = subprocess.run([sys.executable, str(ROOT / "hack" / "get_helm.py")], capture_output=True, text=True,
                          check=True).stdout.strip()
    webhook_repo, webhook_tag = node.images["webhook"].rsplit(":", 1)
    launcher_repo, launcher_tag = node.images["launcher"].rsplit(":", 1)
    home = Path(helm).parent / "home"
    env = {**node.env, "HELM_CONFIG_HOME": str(home / "config"), "HELM_CACHE_HOME": str(home / "cache"),
           "HELM_DATA_HOME": str(home / "data")}
    subprocess.run([helm, "upgrade", "--install", "trainhook", str(ROOT / "charts" / "trainhook"), "--namespace",
                    "trainhook", "--create-namespace", "--wait", "--timeout", "240s",
                    "--set", f"image.repository={webhook_repo}", "--set", f"image.tag={webhook_tag}",
                    "--set", "image.pullPolicy=Never", "--set", f"launcherImage.repository={launcher_repo}",
                    "--set", f"launcherImage.tag={launcher_tag}"], check=True, env=env, capture_output=True)


if __name__ == "__main__":
    sys.exit(main())
