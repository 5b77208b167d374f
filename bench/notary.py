"""The notary at gang start (issues 22 and 26): N members ask for their gang's key at once.

On the real node a 32-pod gang's launchers print their first line (which waits for the key) 2-4 s after their
containers start (docs/develop/performance.md, "Gang start at scale"). This bench isolates the notary's part of that:
- the real v1.20 control plane (hack/cluster.py; no kubelet: the pods stay Pending, which is all a TokenReview
  binds a token to), a real StatefulSet of N pods made by its controller, one pod-bound token per pod from the
  TokenRequest API (what the kubelet writes into the projected volume);
- the real webhook process (`trainhook-webhook --notary-authority cluster`), optionally under a CPU quota (a
  cgroup with cpu.cfs_quota_us, as the chart's `resources.limits.cpu` becomes on a node) and in several replicas
  (the chart runs two; members are spread over them as the Service would);
- N threads, each the launcher's own client (launcher/notary_client.py `NotaryClient.gang_key`: a new TLS connection per
  call, 503 retried after a jittered 0.2-2 s), released together.

Each round is a fresh gang (new StatefulSet, new pods, new tokens), so no cache carries over from an earlier
round. Per gang it reports: seconds until every member has its key (and the median member's), the API calls the
notary made, in all and per member (the API server's own counters, apiserver_request_total, for the verbs the
notary uses; the namespace's pod list+watch is opened in the warm-up round and serves every gang after it, as it
serves a namespace's gangs in a cluster; `--notary-tokens review` shows the TokenReview fallback), the webhook
processes' CPU seconds and the API server's, and the retries the members logged. Every key is checked against
HMAC-SHA256(gang key, GANG_ID).

    python bench/notary.py [--sizes 8,32,64,100] [--rounds 3] [--cpu-limit 0.5] [--replicas 1] [--busy 0]
                            [--notary-tokens auto|review] [--label NAME]

Results: bench/results/notary-<label>.json, and a table on stdout.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "support"))

from cluster_api import cluster  # noqa: E402  hack/cluster.py, loaded as the tests load it
from webhook_process import free_port, start_webhook  # noqa: E402

from trainhook.launcher.notary_client import NotaryClient  # noqa: E402

GANG_KEY = b"bench-notary-gang-key-0123456789abcdef"
SA = "trainer"
TICK = os.sysconf("SC_CLK_TCK")
CGROUP_CPU = Path("/sys/fs/cgroup/cpu")
# What the notary asks the API server (webhook/notary/cluster.py); the controllers use watches, not these verbs.
NOTARY_CALLS = {("POST", "tokenreviews"), ("GET", "pods"), ("LIST", "pods"), ("WATCH", "pods"),
                ("GET", "statefulsets"), ("GET", "jobs")}
METRIC = re.compile(r'^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>[0-9.e+]+)$')


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads), from /proc/PID/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / TICK


class CpuLimit:
    """A cgroup (v1 cpu controller) with a CFS quota: `limit` CPUs, as a container's limits.cpu is enforced."""

    def __init__(self, limit: float, name: str):
        self.path = CGROUP_CPU / f"trainhook-bench-notary-{os.getpid()}-{name}"
        self.path.mkdir()
        period = int((self.path / "cpu.cfs_period_us").read_text())
        (self.path / "cpu.cfs_quota_us").write_text(str(int(limit * period)))

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))  # the whole process, every thread

    def throttled(self) -> tuple[int, float]:
        """(periods throttled, seconds throttled) so far."""
        stat = dict(line.split() for line in (self.path / "cpu.stat").read_text().splitlines())
        return int(stat["nr_throttled"]), int(stat["throttled_time"]) / 1e9

    def remove(self) -> None:
        for pid in (self.path / "cgroup.procs").read_text().split():  # only our webhooks, if still alive
            (CGROUP_CPU / "cgroup.procs").write_text(pid)
        self.path.rmdir()


def api_counts(api) -> dict[str, int]:
    """The API server's request counters for the notary's verbs, summed over response codes."""
    method, url, headers, body, post = api.param_serialize("GET", "/metrics", auth_settings=["BearerToken"])
    response = api.call_api(method, url, header_params=headers, body=body, post_params=post)
    counts: dict[str, int] = {}
    for line in response.read().decode().splitlines():
        match = METRIC.match(line)
        if not match:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match["labels"]))
        if (labels.get("verb"), labels.get("resource")) in NOTARY_CALLS and not labels.get("subresource"):
            name = f"{labels['verb']} {labels['resource']}"
            counts[name] = counts.get(name, 0) + int(float(match["value"]))
    return counts


def statefulset(job: str, replicas: int) -> dict:
    """A StatefulSet as the webhook leaves it admitted: the gang's labels and shape stamped on its template."""
    labels = {"app": job, "trainhook.dev/framework": "pytorch", "trainhook.dev/job-name": job,
              "trainhook.dev/role": "worker"}
    return {"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": job, "labels": {"trainhook.dev/framework": "pytorch",
                                                 "trainhook.dev/job-name": job}},
            "spec": {"replicas": replicas, "serviceName": job, "podManagementPolicy": "Parallel",
                     "selector": {"matchLabels": {"app": job}},
                     "template": {"metadata": {"labels": labels,
                                               "annotations": {"trainhook.dev/replicas": f"worker={replicas}"}},
                                  "spec": {"serviceAccountName": SA, "automountServiceAccountToken": False,
                                           "containers": [{"name": "trainer", "image": "example.com/train:1"}]}}}}


def wait_until(what: str, ready, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:g} s")
        time.sleep(0.2)


def make_gang(api, namespace: str, job: str, size: int, token_dir: Path) -> tuple[str, dict[str, Path]]:
    """Create the gang, wait for its N pods, mint each pod's token; (the StatefulSet's uid, pod -> token file)."""
    from kubernetes import client
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    uid = apps.create_namespaced_stateful_set(namespace, statefulset(job, size)).metadata.uid
    pods: dict[str, str] = {}

    def all_there() -> bool:
        pods.update({p.metadata.name: p.metadata.uid for p in core.list_namespaced_pod(
            namespace, label_selector=f"app={job}").items})
        return len(pods) == size

    wait_until(f"{size} pods of {job}", all_there)
    files = {}
    for pod, pod_uid in sorted(pods.items()):
        answer = core.create_namespaced_service_account_token(SA, namespace, {
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"audiences": ["trainhook"], "expirationSeconds": 3600,
                     "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": pod_uid}}})
        files[pod] = token_dir / f"{job}-{pod}.token"
        files[pod].write_text(answer.status.token)
    return uid, files


def delete_gang(api, namespace: str, job: str) -> None:
    from kubernetes import client
    core = client.CoreV1Api(api)
    client.AppsV1Api(api).delete_namespaced_stateful_set(job, namespace, propagation_policy="Background")
    wait_until(f"{job}'s pods to be gone", lambda: not core.list_namespaced_pod(
        namespace, label_selector=f"app={job}").items)


def ask_together(urls: list[str], ca_pem: str, namespace: str, job: str, files: dict[str, Path]) -> dict:
    """Every member asks for its key at once (a barrier releases the threads); when each got it, and what."""
    barrier = threading.Barrier(len(files) + 1)
    done: dict[str, tuple[float, bytes]] = {}
    retries: list[str] = []
    failed: list[str] = []

    def member(index: int, pod: str, token_file: Path) -> None:
        notary = NotaryClient(urls[index % len(urls)], ca_pem, token_file=str(token_file))
        barrier.wait()
        try:
            key = notary.gang_key(namespace, job, deadline=60, log=retries.append)
        except Exception as e:  # noqa: BLE001 - said below, with the count of members without a key
            failed.append(f"{pod}: {e}")
            return
        done[pod] = (time.perf_counter(), key)

    threads = [threading.Thread(target=member, args=(i, pod, path), daemon=True)
               for i, (pod, path) in enumerate(sorted(files.items()))]
    for thread in threads:
        thread.start()
    barrier.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join(180)
    if len(done) != len(files):
        raise RuntimeError(f"{len(files) - len(done)} of {len(files)} members got no key: {failed[:3]}")
    times = sorted(at - start for at, _ in done.values())
    return {"all_s": times[-1], "median_s": statistics.median(times), "first_s": times[0],
            "keys": {key for _, key in done.values()}, "retries": len(retries), "retry_lines": retries[:5]}


def throttled(limits: list[CpuLimit]) -> tuple[int, float]:
    counts = [limit.throttled() for limit in limits]
    return sum(c[0] for c in counts), sum(c[1] for c in counts)


def round_of(cp, api, hooks, limits, namespace: str, size: int, index: int, token_dir: Path) -> dict:
    job = f"g{size}-{index}-{uuid.uuid4().hex[:4]}"
    uid, files = make_gang(api, namespace, job, size, token_dir)
    time.sleep(1.0)  # the controller's status writes for the new pods settle
    apiserver = cp.pids["kube-apiserver"]
    calls_before, cpu_before = api_counts(api), [cpu_seconds(h.process.pid) for h in hooks]
    api_cpu_before, throttled_before = cpu_seconds(apiserver), throttled(limits)
    asked = ask_together([h.notary_url for h in hooks], hooks[0].ca_file.read_text(), namespace, job, files)
    calls_after, cpu_after = api_counts(api), [cpu_seconds(h.process.pid) for h in hooks]
    throttled_after = throttled(limits)
    gang = f"{namespace}/{job}/{uid}"
    if asked.pop("keys") != {hmac.new(GANG_KEY, gang.encode(), hashlib.sha256).digest()}:
        raise RuntimeError(f"{job}: a member got a key that is not HMAC(gang key, {gang})")
    calls = {k: calls_after.get(k, 0) - calls_before.get(k, 0) for k in sorted(set(calls_after) | set(calls_before))}
    delete_gang(api, namespace, job)
    return {**asked, "size": size, "round": index, "api_calls": sum(calls.values()),
            "api_calls_per_member": sum(calls.values()) / size,
            "api_calls_by_kind": {k: v for k, v in calls.items() if v},
            "webhook_cpu_s": sum(after - before for after, before in zip(cpu_after, cpu_before)),
            "apiserver_cpu_s": cpu_seconds(apiserver) - api_cpu_before,
            "throttled_periods": throttled_after[0] - throttled_before[0],
            "throttled_s": throttled_after[1] - throttled_before[1],
            "load1": os.getloadavg()[0]}


def summary(rounds: list[dict]) -> dict:
    def med(key):
        values = [r[key] for r in rounds]
        return {"median": statistics.median(values), "min": min(values), "max": max(values)}
    return {k: med(k) for k in ("all_s", "median_s", "api_calls", "api_calls_per_member", "webhook_cpu_s",
                                "apiserver_cpu_s", "retries", "throttled_s", "load1")}


def start_hooks(args, cp, workdir: Path, limits: list[CpuLimit]) -> list:
    key_file = workdir / "gang.key"
    key_file.write_bytes(GANG_KEY)
    hooks = []
    for replica in range(args.replicas):
        port, replica_dir = free_port(), workdir / f"replica-{replica}"
        if hooks:  # one serving certificate for every replica, as the chart's replicas share theirs
            shutil.copytree(workdir / "replica-0" / "certs", replica_dir / "certs")
        hook = start_webhook(replica_dir, env=cp.env(), extra_args=[
            "--notary-authority", "cluster", "--notary-port", str(port),
            "--notary-url", f"https://127.0.0.1:{port}", "--gang-key-file", str(key_file),
            "--notary-tokens", args.notary_tokens])
        hook.notary_url = f"https://127.0.0.1:{port}"
        if limits:
            limits[replica].add(hook.process.pid)
        hooks.append(hook)
    return hooks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="8,32,64,100", help="gang sizes, comma-separated")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per size (each a fresh gang); default 3")
    parser.add_argument("--cpu-limit", type=float, default=0.0,
                        help="CPUs each webhook replica may use (the chart's limit is 0.5); 0: none")
    parser.add_argument("--replicas", type=int, default=1, help="webhook replicas the members are spread over")
    parser.add_argument("--busy", type=int, default=0,
                        help="processes spinning on the CPUs meanwhile (a loaded node: its kubelet, containerd, "
                             "the launchers' own start); default 0")
    parser.add_argument("--notary-tokens", default="auto", choices=("auto", "review"),
                        help="the webhook's --notary-tokens: auto (the published keys, where served) or review "
                             "(a TokenReview per member, as before issue 31)")
    parser.add_argument("--label", default="run", help="names the results file")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    from kubernetes import client
    with tempfile.TemporaryDirectory(prefix="bench-notary-") as tmp:
        workdir = Path(tmp)
        cp = cluster.start(workdir / "control-plane")
        limits = [CpuLimit(args.cpu_limit, f"r{i}") for i in range(args.replicas)] if args.cpu_limit else []
        hooks, busy = [], [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
        try:
            hooks = start_hooks(args, cp, workdir, limits)
            api = cp.api_client()
            namespace = "bench-notary"
            client.CoreV1Api(api).create_namespace({"metadata": {"name": namespace}})
            wait_until("the namespace's default ServiceAccount",
                       lambda: client.CoreV1Api(api).list_namespaced_service_account(namespace).items)
            client.CoreV1Api(api).create_namespaced_service_account(namespace, {"metadata": {"name": SA}})
            (workdir / "tokens").mkdir()
            round_of(cp, api, hooks, limits, namespace, 4, 0, workdir / "tokens")  # warm-up: imports, pools
            results = {"label": args.label, "cpu_limit": args.cpu_limit, "replicas": args.replicas, "busy": args.busy,
                       "cpus": os.cpu_count(), "sizes": {}}
            print(f"{'pods':>5} {'all keys s':>16} {'median member s':>16} {'API calls':>10} {'per member':>10} "
                  f"{'webhook CPU s':>14} "
                  f"{'apiserver CPU s':>16} {'retries':>8} {'throttled s':>12} {'load':>6}", flush=True)
            for size in sizes:
                rounds = [round_of(cp, api, hooks, limits, namespace, size, i + 1, workdir / "tokens")
                          for i in range(args.rounds)]
                s = summary(rounds)
                results["sizes"][size] = {"summary": s, "rounds": rounds}
                print(f"{size:>5} {s['all_s']['median']:>7.2f} ({s['all_s']['min']:.2f}-{s['all_s']['max']:.2f}) "
                      f"{s['median_s']['median']:>16.2f} {s['api_calls']['median']:>10.0f} "
                      f"{s['api_calls_per_member']['median']:>10.3f} "
                      f"{s['webhook_cpu_s']['median']:>14.2f} {s['apiserver_cpu_s']['median']:>16.2f} "
                      f"{s['retries']['median']:>8.0f} {s['throttled_s']['median']:>12.2f} "
                      f"{s['load1']['median']:>6.1f}", flush=True)
                print(f"      calls by kind (last round): {rounds[-1]['api_calls_by_kind']}", flush=True)
            args.out.mkdir(parents=True, exist_ok=True)
            out = args.out / f"notary-{args.label}.json"
            out.write_text(json.dumps(results, indent=1))
            print(f"results: {out}")
        finally:
            for hook in hooks:
                hook.stop()
            for process in busy:
                process.kill()
                process.wait()
            for limit in limits:
                limit.remove()
            cp.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
