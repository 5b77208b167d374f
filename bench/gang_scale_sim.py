"""A gang of N members against trainhook's real central parts (issue 32): what trainhook costs the cluster.

Real: the tests' Kubernetes v1.20 control plane (hack/cluster.py: etcd, kube-apiserver, kube-controller-manager; no
kubelet, so pods stay Pending and never run), trainhook's webhook process (`trainhook-webhook` with its notary,
`--notary-authority cluster`, as the chart runs it) registered as the API server's mutating webhook, the gang's
headless Service and StatefulSet admitted by it and its N pods created by the real StatefulSet controller and
admitted by it, one TokenRequest token per pod bound to that pod with audience `trainhook` (what the kubelet projects
into the pod), and rank 0's launcher code (the real Coordinator) in a process of its own on loopback.
Simulated: the members, many per process (bench/gang_scale_members.py), each running the launcher's own
NotaryClient.gang_key and Link (its sockets read by one selectors loop per process, not a thread each); they run no
training (a `start` is answered at once) and everything shares 2 cores.

The run: every member asks the notary for the gang's key at once and joins the coordinator; the barrier starts
attempt 1; member 1 fails with 137 under restart-gang (an in-place restart round: every member stopped, attempt 2
started); every member finishes; rank 0 exits 0, the gang succeeds, every member acknowledges, and rank 0 records
the outcome through the notary.

    python bench/gang_scale_sim.py --members N [--json] [--procs K]

prints one JSON object (--json) or a table: members, api_calls_per_member (the notary's requests counted by the API
server's apiserver_request_total during the credentials), credential_s (first member's request to last member's
key), barrier_s (last join to every member started), restart_s (the failure reported to every member running again),
outcome_s, notary_cpu_ms_per_member, admission_cpu_ms_per_pod, coordinator_cpu_ms_per_member (its process, the
whole run: join, start, restart, finish), coordinator_rss_mb, coordinator_threads, coordinator_fds.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "support"))

from cluster_api import cluster, register_webhook  # noqa: E402  hack/cluster.py, loaded as the tests load it
from webhook_process import free_port, start_webhook  # noqa: E402

GANG_KEY = b"bench-scale-gang-key-0123456789abcdef"
JOB, NAMESPACE, SA = "scale", "scale", "trainer"
TICK = os.sysconf("SC_CLK_TCK")
METRIC = re.compile(r'^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>[0-9.e+]+)$')
# What the notary may ask the API server (webhook/notary/cluster.py), by (verb, resource, subresource). Pods are
# Pending and no kubelet runs, so no controller makes these calls while the credentials are handed out.
NOTARY_CALLS = {("POST", "tokenreviews", ""), ("GET", "pods", ""), ("LIST", "pods", ""), ("WATCH", "pods", ""),
                ("GET", "statefulsets", ""), ("GET", "jobs", ""), ("PATCH", "statefulsets", ""),
                ("GET", "statefulsets", "scale"), ("PATCH", "statefulsets", "scale"),
                ("UPDATE", "statefulsets", "scale")}
MEMBERS_PER_PROCESS = 500  # simulated members in one process (one loop reads their links; TLS handshakes hold its GIL)


def proc_cpu(pid: int) -> float:
    """User + system CPU seconds of a process, all its threads (/proc/PID/stat)."""
    return proc_cpu_path(f"/proc/{pid}/stat")


def loop_thread_cpu(pid: int) -> float:
    """CPU seconds of a process's main thread (the webhook's event loop: TLS, HTTP, the notary's decisions); the
    rest of its CPU is its other threads' (the pod watch decoding lists and events, blocking API calls)."""
    return proc_cpu_path(f"/proc/{pid}/task/{pid}/stat")


def proc_cpu_path(path: str) -> float:
    stat = Path(path).read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def proc_status(pid: int) -> dict:
    """Peak and current memory (MB), threads and open file descriptors of a process."""
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return {"rss_mb": int(status["VmRSS"].split()[0]) / 1024, "peak_rss_mb": int(status["VmHWM"].split()[0]) / 1024,
            "threads": int(status["Threads"]), "fds": len(os.listdir(f"/proc/{pid}/fd"))}


def api_counts(api) -> dict[tuple[str, str, str], int]:
    """Every (verb, resource, subresource) the API server has served, summed over codes and scopes."""
    method, url, headers, body, post = api.param_serialize("GET", "/metrics", auth_settings=["BearerToken"])
    response = api.call_api(method, url, header_params=headers, body=body, post_params=post)
    counts: dict[tuple[str, str, str], int] = {}
    for line in response.read().decode().splitlines():
        match = METRIC.match(line)
        if match:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match["labels"]))
            key = (labels.get("verb", ""), labels.get("resource", ""), labels.get("subresource", ""))
            counts[key] = counts.get(key, 0) + int(float(match["value"]))
    return counts


def notary_calls(before: dict, after: dict) -> dict[str, int]:
    """The notary's kinds of request made between two readings, by name (`POST tokenreviews`)."""
    return {" ".join(k for k in key if k): after.get(key, 0) - before.get(key, 0) for key in sorted(NOTARY_CALLS)
            if after.get(key, 0) - before.get(key, 0)}


def wait_until(what: str, ready, timeout: float, every: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:g} s")
        time.sleep(every)


def workload(size: int) -> list[dict]:
    """The gang as a user writes it: a headless Service and a labeled StatefulSet under restart-gang."""
    labels = {"trainhook.dev/framework": "pytorch", "trainhook.dev/job-name": JOB}
    service = {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": JOB, "labels": {"trainhook.dev/job-name": JOB}},
               "spec": {"clusterIP": "None", "selector": {"app": JOB}, "ports": [{"port": 29500}]}}
    sts = {"apiVersion": "apps/v1", "kind": "StatefulSet",
           "metadata": {"name": JOB, "labels": labels, "annotations": {"trainhook.dev/on-failure": "restart-gang",
                                                                      "trainhook.dev/max-restarts": "3"}},
           "spec": {"replicas": size, "serviceName": JOB, "podManagementPolicy": "Parallel",
                    "selector": {"matchLabels": {"app": JOB}},
                    "template": {"metadata": {"labels": {"app": JOB}},
                                 "spec": {"serviceAccountName": SA,
                                          "containers": [{"name": "trainer", "image": "example.com/train:1",
                                                          "command": ["python", "train.py"]}]}}}}
    return [service, sts]


class Child:
    """A process of bench/gang_scale_members.py: commands to its stdin, its JSON events read on a thread."""

    def __init__(self, args: list[str]):
        self.process = subprocess.Popen([sys.executable, str(ROOT / "bench" / "gang_scale_members.py"), *args],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        self.events: list[dict] = []
        self.changed = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("{"):
                with self.changed:
                    self.events.append(json.loads(line))
                    self.changed.notify_all()

    def send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def wait(self, timeout: float, event: str, **match) -> dict:
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                for e in self.events:
                    if e["event"] == event and all(e.get(k) == v for k, v in match.items()):
                        return e
                failed = [e for e in self.events if e["event"] == "failed"]
                ended = self.process.poll() is not None and not self.reader.is_alive()  # and every line read
                if failed or ended or time.monotonic() > deadline:
                    raise RuntimeError(f"no {event} {match} from pid {self.process.pid} within {timeout:g} s: "
                                       f"{failed[:2] or self.events[-3:]}")
                self.changed.wait(1.0)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def make_gang(api, size: int, hook, tokens: Path, log) -> dict:
    """Create the gang through the admitting API server; each pod's token; rank 0's env. What admission cost."""
    from kubernetes import client
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    core.create_namespace({"metadata": {"name": NAMESPACE}})
    core.create_namespaced_service_account(NAMESPACE, {"metadata": {"name": SA}})
    service, sts = workload(size)
    cpu, started = proc_cpu(hook.process.pid), time.time()
    core.create_namespaced_service(NAMESPACE, service)
    apps.create_namespaced_stateful_set(NAMESPACE, sts)
    wait_until(f"the StatefulSet controller's {size} pods", lambda: (apps.read_namespaced_stateful_set(
        JOB, NAMESPACE).status.replicas or 0) >= size, timeout=60 + size * 0.2, every=1.0)
    created_s, admission_cpu = time.time() - started, proc_cpu(hook.process.pid) - cpu
    log(f"{size} pods created and admitted in {created_s:.1f} s")
    listed = json.loads(core.list_namespaced_pod(NAMESPACE, label_selector=f"app={JOB}",
                                                 _preload_content=False).data)["items"]
    pods = {int(p["metadata"]["name"].rsplit("-", 1)[1]): p for p in listed}
    env = {e["name"]: e["value"] for e in pods[0]["spec"]["containers"][0]["env"] if "value" in e}

    def token(rank: int) -> None:
        pod = pods[rank]["metadata"]
        answer = core.create_namespaced_service_account_token(SA, NAMESPACE, {
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"audiences": ["trainhook"], "expirationSeconds": 3600,
                     "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod["name"], "uid": pod["uid"]}}})
        (tokens / f"{rank}.token").write_text(answer.status.token)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(token, range(size)))
    log(f"{size} pod-bound tokens minted")
    return {"env": env, "pods_created_s": created_s, "admission_cpu_ms_per_pod": admission_cpu / size * 1000,
            "pod_env_bytes": len(json.dumps(pods[0]["spec"]["containers"][0].get("env", [])))}


def span(events: list[dict], what: str) -> tuple[float, float]:
    """(first, last) time of `what` over every process's "all" event."""
    found = [e for e in events if e["event"] == "all" and e["what"] == what]
    return min(e["first"] for e in found), max(e["last"] for e in found)


def simulate(args, workdir: Path, log) -> dict:
    cp = cluster.start(workdir / "control-plane", kube_api_qps=args.kube_api_qps, kube_api_burst=args.kube_api_burst)
    children: list[Child] = []
    hook = None
    try:
        key_file = workdir / "gang.key"
        key_file.write_bytes(GANG_KEY)
        notary_port = free_port()
        hook = start_webhook(workdir / "webhook", env=cp.env(), extra_args=[
            "--notary-authority", "cluster", "--notary-port", str(notary_port),
            "--notary-url", f"https://127.0.0.1:{notary_port}", "--gang-key-file", str(key_file)])
        api = cp.api_client()
        register_webhook(api, hook.ca_file.read_bytes(), hook.url + "/mutate")
        time.sleep(2.0)  # the API server takes the configuration up through an informer
        tokens = workdir / "tokens"
        tokens.mkdir()
        result: dict = {"members": args.members, **make_gang(api, args.members, hook, tokens, log)}
        gang_file = workdir / "gang.json"
        gang_file.write_text(json.dumps(result.pop("env")))
        port = free_port()
        calls_before, notary_cpu = api_counts(api), proc_cpu(hook.process.pid)
        notary_loop_cpu = loop_thread_cpu(hook.process.pid)
        rank0 = Child(["coordinator", "--gang", str(gang_file), "--tokens", str(tokens), "--port", str(port),
                       "--log", str(workdir / "coordinator.log")])
        children.append(rank0)
        rank0.wait(120, "listening")
        coordinator = rank0.process.pid
        coordinator_cpu = cpu_before = proc_cpu(coordinator)
        procs = args.procs or max(1, round((args.members - 1) / MEMBERS_PER_PROCESS))
        bounds = [1 + (args.members - 1) * i // procs for i in range(procs + 1)]
        go_at = time.time() + 1.0
        members = [Child(["members", "--gang", str(gang_file), "--tokens", str(tokens), "--port", str(port),
                          "--ranks", f"{low}:{high}", "--go-at", str(go_at),
                          "--threads", str(-(-args.concurrency // procs)),
                          *(["--one-address"] if args.one_address else [])])
                   for low, high in zip(bounds, bounds[1:]) if high > low]
        children.extend(members)
        apiserver = cp.pids["kube-apiserver"]
        others_cpu = proc_cpu(apiserver), sum(proc_cpu(c.process.pid) for c in members)
        patience = 60 + args.members * 0.05
        for child in members:
            child.wait(patience, "all", what="key")
        calls_after, notary_cpu = api_counts(api), proc_cpu(hook.process.pid) - notary_cpu
        notary_loop_cpu = loop_thread_cpu(hook.process.pid) - notary_loop_cpu
        apiserver_cpu = proc_cpu(apiserver) - others_cpu[0]
        members_cpu = sum(proc_cpu(c.process.pid) for c in members) - others_cpu[1]
        events = [e for child in members for e in child.events]
        first_asked, _ = span(events, "asked")
        _, last_key = span(events, "key")
        calls = notary_calls(calls_before, calls_after)
        keyed = [e for e in events if e["event"] == "all" and e["what"] == "key"]
        retries = sum(e.get("retries", 0) for e in keyed)
        reasons = sorted({r for e in keyed for r in e.get("reasons", [])})[:3]
        log(f"credentials: {last_key - first_asked:.2f} s; the notary's API calls {calls}")
        for child in children:
            child.wait(patience, "all", what="start1")
        events = [e for child in children for e in child.events]
        _, last_join = span(events, "joined")
        _, last_start = span(events, "start1")
        assembled, cpu_started = proc_status(coordinator), proc_cpu(coordinator)
        log(f"barrier: {last_start - last_join:.2f} s after the last join; coordinator {assembled}")
        failed_at = time.time()
        members[0].send(f"fail {bounds[0]}")
        for child in children:
            child.wait(patience, "all", what="start2")
        events = [e for child in children for e in child.events]
        _, restarted = span(events, "start2")
        cpu_restarted = proc_cpu(coordinator)
        log(f"restart round: {restarted - failed_at:.2f} s")
        for child in members:
            child.send("finish")
        for child in members:
            child.wait(patience, "all", what="finish")
        time.sleep(1.0)  # their exit-0 reports reach the coordinator before rank 0's own
        record_calls = api_counts(api)
        rank0.send("finish")
        recorded = rank0.wait(patience + 60, "recorded")
        for child in members:
            child.wait(patience, "all", what="done")
        coordinator_cpu = proc_cpu(coordinator) - coordinator_cpu
        ended = proc_status(coordinator)
        outcome_calls = notary_calls(record_calls, api_counts(api))
        for child in reversed(children):  # the members first: rank 0's coordinator closing is not a loss mid-run
            child.send("quit")
            child.wait(60, "summary")
        summaries = [child.wait(60, "summary") for child in children]
        phases: dict[str, int] = {}
        for summary in summaries:
            for what, count in summary["counts"].items():
                phases[what] = phases.get(what, 0) + count
        lost = [why for summary in summaries for why in summary["lost_why"]]
        log(f"members through each phase {phases}; connections lost {sum(s['lost'] for s in summaries)} {lost[:3]}")
        log(f"outcome: {recorded['outcome'] and recorded['outcome']['phase']}, recorded {recorded['said']!r}")
        return {**result, "api_calls_per_member": sum(calls.values()) / args.members, "api_calls": calls,
                "credential_s": last_key - first_asked, "credential_retries": retries,
                "credential_retry_reasons": reasons, "barrier_s": last_start - last_join,
                "restart_s": restarted - failed_at, "outcome_s": recorded["recorded"] - recorded["finished"],
                "outcome_delivered_s": recorded["acked"] - recorded["finished"], "outcome_api_calls": outcome_calls,
                "outcome_phase": (recorded["outcome"] or {}).get("phase"), "outcome_recorded": recorded["said"],
                "notary_cpu_ms_per_member": notary_cpu / args.members * 1000,
                "notary_loop_cpu_ms_per_member": notary_loop_cpu / args.members * 1000,  # its event loop's share
                "notary_busy": notary_cpu / (last_key - first_asked),  # CPUs the webhook process used meanwhile
                # the same phase's CPU seconds of the API server and of the simulated members (their TLS handshakes)
                "credential_apiserver_cpu_s": apiserver_cpu, "credential_members_cpu_s": members_cpu,
                "coordinator_cpu_ms_per_member": coordinator_cpu / args.members * 1000,
                # by phase: every member's join and the start of attempt 1; the restart round (a stop and a start
                # each); every member's exit 0, the outcome and its acknowledgement
                "coordinator_cpu_ms_per_member_join_start": (cpu_started - cpu_before) / args.members * 1000,
                "coordinator_cpu_ms_per_member_restart": (cpu_restarted - cpu_started) / args.members * 1000,
                "coordinator_cpu_ms_per_member_finish": (cpu_before + coordinator_cpu - cpu_restarted)
                / args.members * 1000,
                "coordinator_rss_mb": max(assembled["peak_rss_mb"], ended["peak_rss_mb"]),
                "coordinator_threads": max(assembled["threads"], ended["threads"]),
                "coordinator_fds": assembled["fds"], "member_processes": len(members),
                "concurrency": args.concurrency, "one_address": args.one_address,
                # how many members went through each phase (asked, key, joined, start1, stop1, fail, start2, finish,
                # done), and the members' connections to the coordinator lost mid-run (each a spurious restart
                # round under restart-gang) or refused at their connect (retried)
                "phases": phases, "member_connections_lost": sum(s["lost"] for s in summaries),
                "member_connections_lost_why": lost[:5],
                "member_connect_retries": sum(s["connect_errors"] for s in summaries),
                # the loopback addresses the members' notary calls came from (each its own, unless --one-address)
                "notary_source_addresses": sum(s["notary_source_addresses"] for s in summaries),
                "member_connect_retries_why": [w for s in summaries for w in s["connect_errors_why"]][:5],
                "kube_api_qps": args.kube_api_qps, "kube_api_burst": args.kube_api_burst,
                "load1": os.getloadavg()[0]}
    finally:
        for child in reversed(children):  # the members first: losing rank 0 is not what they should report
            child.stop()
        if hook is not None:
            hook.stop()
        cp.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--members", type=int, default=100)
    parser.add_argument("--procs", type=int, default=0, help=f"member processes (default: one per "
                                                             f"{MEMBERS_PER_PROCESS} members)")
    parser.add_argument("--concurrency", type=int, default=96,
                        help="members asking the notary at once, over all member processes (default %(default)s, "
                             "as pods starting over some seconds would; performance.md says what 1,500 at once do)")
    parser.add_argument("--one-address", action="store_true",
                        help="every simulated member connects from 127.0.0.1 (default: each from its own loopback "
                             "address, as each pod has its own; the notary bounds connections per address)")
    parser.add_argument("--kube-api-qps", type=int, default=200,
                        help="the controller-manager's requests a second to the API server (its own default, 0 "
                             "here, is 20: 10,000 pods took 8 minutes to create); a real cluster's has the same flag")
    parser.add_argument("--kube-api-burst", type=int, default=400, help="its burst (0: its own default, 30)")
    parser.add_argument("--json", action="store_true", help="print one JSON object, nothing else on stdout")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, tokens)")
    args = parser.parse_args(argv)

    def log(line: str) -> None:
        print(f"[gang_scale_sim {args.members}] {line}", file=sys.stderr if args.json else sys.stdout, flush=True)
    workdir = Path(tempfile.mkdtemp(prefix=f"trainhook-scale-{args.members}-"))
    result = simulate(args, workdir, log)
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        for key, value in sorted(result.items()):
            print(f"{key:32} {value:.3f}" if isinstance(value, float) else f"{key:32} {value}")
    if args.keep:
        log(f"kept {workdir}")
    else:
        import shutil
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
