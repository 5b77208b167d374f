"""Admission benchmark: trainhook's webhook against the cheapest correct aiohttp webhook, in the same run.

Both servers run as real processes over TLS with keep-alive, pinned to one CPU; the load generator runs on the
other. For pod reviews of a 2-pod gang and of a 1024-pod gang (and the yardstick, which parses and allows):
- saturation: reviews/s with 16 keep-alive connections, and the server's own CPU time per review (from
  /proc/PID/stat), which a load generator that cannot keep up does not distort; the three series take turns
  in 1-second slices, so a change in the machine's background load falls on all three alike;
- fixed rates: latency p50 and p99, from each request's scheduled send time (a slow server cannot hide
  queueing behind a slow sender);
- `review()` alone, in this process: microseconds per pod review, 2-pod and 1024-pod gangs interleaved.
The three series are measured in turn, in a rotated order, `--repeat` times; results keep every repetition and
the median of each figure.

    python bench/admission.py [--seconds 10] [--repeat 3] [--out bench/results]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "support"))

from objects import pod_of_statefulset, review, statefulset  # noqa: E402
from webhook_process import free_port, start_webhook  # noqa: E402

from trainhook.webhook.admission.mutate import mutate  # noqa: E402
from trainhook.webhook.admission.review import review as answer  # noqa: E402
from trainhook.webhook.settings import Settings  # noqa: E402

CONNECTIONS = 16
RATES = (200, 400, 800, 1600)
SERIES = ("yardstick", "gang2", "gang1024")
TICK = os.sysconf("SC_CLK_TCK")


def gang_bodies(size: int, count: int = 256) -> list[bytes]:
    """Pod reviews as the API server sends them for pods of a `size`-pod StatefulSet gang."""
    sts = mutate("StatefulSet", "CREATE", statefulset(f"gang{size}", size), "team-a", Settings()).obj
    rng = random.Random(size)
    return [json.dumps(review(pod_of_statefulset(sts, rng.randrange(size)))).encode() for _ in range(count)]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads), from /proc/PID/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / TICK


async def saturate(targets: dict[str, tuple[str, int, list[bytes]]], context: ssl.SSLContext, seconds: float,
                   order: list[str], slice_s: float = 1.0) -> dict[str, dict]:
    """Saturation of every target in turn, in slices of `slice_s` (so a change in the machine's background load
    falls on all of them alike), `seconds` in all for each. targets: name -> (url, server pid, bodies)."""
    totals = {name: {"done": 0, "errors": 0, "wall": 0.0, "server_cpu": 0.0, "client_cpu": 0.0} for name in targets}
    sessions = {name: aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=CONNECTIONS, ssl=context))
                for name in targets}
    try:
        async def run(name: str, deadline: float) -> tuple[int, int]:
            url, _, bodies = targets[name]
            done, errors = 0, 0

            async def worker(n: int) -> None:
                nonlocal done, errors
                while time.perf_counter() < deadline:
                    async with sessions[name].post(url, data=bodies[n % len(bodies)]) as reply:
                        await reply.read()
                        done, errors = done + 1, errors + (reply.status != 200)
                    n += CONNECTIONS
            await asyncio.gather(*(worker(i) for i in range(CONNECTIONS)))
            return done, errors

        for name in order:  # warm-up: TLS handshakes, keep-alive connections open
            await run(name, time.perf_counter() + 0.5)
        for _ in range(max(1, round(seconds / slice_s))):
            for name in order:
                pid, total = targets[name][1], totals[name]
                server_cpu, client_cpu, start = cpu_seconds(pid), time.process_time(), time.perf_counter()
                done, errors = await run(name, start + slice_s)
                total["wall"] += time.perf_counter() - start
                total["server_cpu"] += cpu_seconds(pid) - server_cpu
                total["client_cpu"] += time.process_time() - client_cpu
                total["done"] += done
                total["errors"] += errors
    finally:
        for session in sessions.values():
            await session.close()
    return {name: {"throughput_rps": t["done"] / t["wall"], "errors": t["errors"],
                   "server_cpu_us_per_review": t["server_cpu"] / t["done"] * 1e6,
                   "server_core_busy": t["server_cpu"] / t["wall"], "client_core_busy": t["client_cpu"] / t["wall"]}
            for name, t in totals.items()}


async def fixed_rate(url: str, context: ssl.SSLContext, bodies: list[bytes], rate: int, seconds: float) -> dict:
    latencies: list[float] = []
    errors = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=CONNECTIONS * 4, ssl=context)) as session:
        async def one(n: int, scheduled: float) -> None:
            nonlocal errors
            await asyncio.sleep(max(0.0, scheduled - time.perf_counter()))
            async with session.post(url, data=bodies[n % len(bodies)]) as reply:
                await reply.read()
                errors += reply.status != 200
            latencies.append(time.perf_counter() - scheduled)
        start = time.perf_counter() + 0.1
        await asyncio.gather(*(one(n, start + n / rate) for n in range(int(rate * seconds))))
    q = statistics.quantiles(latencies, n=100)
    return {"rate": rate, "p50_ms": q[49] * 1000, "p99_ms": q[98] * 1000, "errors": errors}


def start_yardstick(workdir: Path, ca_file: str) -> tuple[subprocess.Popen, str]:
    certs = workdir / "certs"
    port = free_port()
    process = subprocess.Popen([sys.executable, str(ROOT / "bench" / "yardstick.py"), str(certs / "tls.crt"),
                                str(certs / "tls.key"), str(port)])
    url = f"https://127.0.0.1:{port}"
    context = ssl.create_default_context(cafile=ca_file)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # healthy, as start_webhook waits for the webhook
        try:
            asyncio.run(_get(url + "/healthz", context))
            return process, url
        except (aiohttp.ClientError, OSError):
            time.sleep(0.1)
    process.kill()
    raise RuntimeError("the yardstick did not become healthy")


async def _get(url: str, context: ssl.SSLContext) -> None:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:
        async with session.get(url) as reply:
            reply.raise_for_status()


def review_only(bodies: dict[str, list[bytes]], rounds: int = 20, per_round: int = 200) -> dict:
    """Microseconds per `review()` of parsed pod reviews (no HTTP, no TLS), the gangs interleaved per round;
    the median over rounds."""
    settings = Settings(gang_key=b"bench" * 8)
    parsed = {name: [json.loads(b) for b in items] for name, items in bodies.items()}
    samples: dict[str, list[float]] = {name: [] for name in parsed}
    for r in range(rounds):
        for name in (list(parsed) if r % 2 else list(reversed(parsed))):
            items = parsed[name]
            start = time.perf_counter()
            for i in range(per_round):
                answer(items[i % len(items)], settings)
            samples[name].append((time.perf_counter() - start) / per_round * 1e6)
    return {name: statistics.median(values) for name, values in samples.items()}


def versions() -> dict:
    from importlib.metadata import version
    return {"python": platform.python_version(), **{name: version(name) for name in ("aiohttp", "orjson",
                                                                                     "prometheus-client")},
            "openssl": ssl.OPENSSL_VERSION,
            "cpu": _cpu_model(), "cores": os.cpu_count(), "kernel": platform.release(),
            "loadavg_at_start": os.getloadavg()}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def median_of(repeats: list[dict], name: str) -> dict:
    """One series' figures, each the median over the repetitions (with min and max of throughput)."""
    runs = [r[name] for r in repeats]
    keys = ("throughput_rps", "server_cpu_us_per_review", "server_core_busy", "client_core_busy")
    result: dict = {k: statistics.median(run["saturation"][k] for run in runs) for k in keys}
    result["throughput_min_max"] = [min(run["saturation"]["throughput_rps"] for run in runs),
                                    max(run["saturation"]["throughput_rps"] for run in runs)]
    result["errors"] = sum(run["saturation"]["errors"] + sum(f["errors"] for f in run["fixed"]) for run in runs)
    result["fixed"] = [{"rate": rate, "p50_ms": statistics.median(run["fixed"][i]["p50_ms"] for run in runs),
                        "p99_ms": statistics.median(run["fixed"][i]["p99_ms"] for run in runs),
                        "p99_ms_min_max": [min(run["fixed"][i]["p99_ms"] for run in runs),
                                           max(run["fixed"][i]["p99_ms"] for run in runs)]}
                       for i, rate in enumerate(RATES)]
    return result


def ratio_spread(repeats: list[dict], top: tuple[str, str], bottom: tuple[str, str]) -> dict:
    """The ratio top/bottom within each repetition (measured minutes apart, not hours), median, min, max."""
    values = [r[top[0]]["saturation"][top[1]] / r[bottom[0]]["saturation"][bottom[1]] for r in repeats]
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "values": values}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each saturation and fixed-rate run")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="trainhook-bench-"))
    hook = start_webhook(workdir)
    yard, yard_url = start_yardstick(workdir, str(hook.ca_file))
    servers = {"yardstick": (yard_url, yard.pid), "gang2": (hook.url, hook.process.pid),
               "gang1024": (hook.url, hook.process.pid)}
    cores = sorted(os.sched_getaffinity(0))
    for pid in (hook.process.pid, yard.pid):
        os.sched_setaffinity(pid, {cores[0]})
    if len(cores) > 1:
        os.sched_setaffinity(0, set(cores[1:]))
    context = ssl.create_default_context(cafile=str(hook.ca_file))
    bodies = {"yardstick": gang_bodies(2), "gang2": gang_bodies(2), "gang1024": gang_bodies(1024)}
    repeats: list[dict] = []
    try:
        for n in range(args.repeat):
            order = SERIES[n % 3:] + SERIES[:n % 3]
            repeat: dict = {name: {"fixed": []} for name in SERIES}
            targets = {name: (servers[name][0] + "/mutate", servers[name][1], bodies[name]) for name in SERIES}
            saturation = asyncio.run(saturate(targets, context, args.seconds, list(order)))
            for name in SERIES:
                repeat[name]["saturation"] = saturation[name]
            for rate in RATES:
                for name in order:
                    url, _ = servers[name]
                    repeat[name]["fixed"].append(asyncio.run(fixed_rate(url + "/mutate", context, bodies[name],
                                                                        rate, args.seconds)))
            print(f"repeat {n + 1}/{args.repeat}: " + ", ".join(
                f"{name} {repeat[name]['saturation']['throughput_rps']:.0f}/s "
                f"{repeat[name]['saturation']['server_cpu_us_per_review']:.0f} us CPU" for name in SERIES),
                file=sys.stderr, flush=True)
            repeats.append(repeat)
    finally:
        hook.stop()
        yard.terminate()
        yard.wait()
    os.sched_setaffinity(0, set(cores))
    results: dict = {"machine": versions(), "seconds": args.seconds, "repeat": args.repeat,
                     "connections": CONNECTIONS, "rates": list(RATES)}
    results.update({name: median_of(repeats, name) for name in SERIES})
    review_us = review_only({"gang2": bodies["gang2"], "gang1024": bodies["gang1024"]})
    results["review_only_us"] = review_us
    results["ratios"] = {
        # Goal: >= 0.5. Throughput, and the same from the servers' CPU time per review (yardstick / trainhook).
        "gang2_vs_yardstick_throughput": ratio_spread(repeats, ("gang2", "throughput_rps"),
                                                      ("yardstick", "throughput_rps")),
        "gang2_vs_yardstick_cpu": ratio_spread(repeats, ("yardstick", "server_cpu_us_per_review"),
                                               ("gang2", "server_cpu_us_per_review")),
        # Goal: <= 1.10. A 1024-pod gang's pod review cost over a 2-pod gang's.
        "gang1024_cost_vs_gang2_throughput": ratio_spread(repeats, ("gang2", "throughput_rps"),
                                                          ("gang1024", "throughput_rps")),
        "gang1024_cost_vs_gang2_cpu": ratio_spread(repeats, ("gang1024", "server_cpu_us_per_review"),
                                                   ("gang2", "server_cpu_us_per_review")),
        "gang1024_cost_vs_gang2_review_only": review_us["gang1024"] / review_us["gang2"],
    }
    results["repeats"] = repeats
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "admission.json").write_text(json.dumps(results, indent=2))
    print(json.dumps({k: results[k] for k in ("machine", "ratios", "review_only_us")}, indent=2))
    for name in SERIES:
        r = results[name]
        low, high = r["throughput_min_max"]
        print(f"{name:9s} {r['throughput_rps']:7.0f}/s ({low:.0f}-{high:.0f}) "
              f"server {r['server_cpu_us_per_review']:.0f} us CPU/review, core busy {r['server_core_busy']:.2f}, "
              f"client busy {r['client_core_busy']:.2f}; "
              + " ".join(f"{f['rate']}/s p50 {f['p50_ms']:.1f} p99 {f['p99_ms']:.1f} ms" for f in r["fixed"]))


if __name__ == "__main__":
    main()
