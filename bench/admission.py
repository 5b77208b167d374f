"""Admission benchmark: trainhook's webhook against the cheapest correct aiohttp webhook, in the same run.

Both servers run as real processes over TLS with keep-alive, pinned to one CPU; the load generator runs on the
other. Measures throughput at saturation and latency (p50, p99, from each request's scheduled send time, so a
slow server cannot hide queueing) at fixed rates, for pod reviews of a 2-pod gang and of a 1024-pod gang.

    python bench/admission.py [--seconds 5] [--out bench/results]
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
sys.path.insert(0, str(ROOT / "tests"))

from objects import pod_of_statefulset, review, statefulset  # noqa: E402
from webhook_process import free_port, start_webhook  # noqa: E402

from trainhook.webhook.mutate import mutate  # noqa: E402
from trainhook.webhook.settings import Settings  # noqa: E402

CONNECTIONS = 16
RATES = (200, 400, 800)


def gang_bodies(size: int, count: int = 256) -> list[bytes]:
    """Pod reviews as the API server sends them for pods of a `size`-pod StatefulSet gang."""
    sts = mutate("StatefulSet", "CREATE", statefulset(f"gang{size}", size), "team-a", Settings()).obj
    rng = random.Random(size)
    return [json.dumps(review(pod_of_statefulset(sts, rng.randrange(size)))).encode() for _ in range(count)]


async def saturate(url: str, context: ssl.SSLContext, bodies: list[bytes], seconds: float) -> dict:
    done, errors = 0, 0
    deadline = time.perf_counter() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=CONNECTIONS, ssl=context)) as session:
        async def worker(n: int) -> None:
            nonlocal done, errors
            while time.perf_counter() < deadline:
                async with session.post(url, data=bodies[n % len(bodies)]) as reply:
                    await reply.read()
                    done, errors = done + 1, errors + (reply.status != 200)
                n += CONNECTIONS
        await asyncio.gather(*(worker(i) for i in range(CONNECTIONS)))
    return {"throughput_rps": done / seconds, "errors": errors}


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


def start_yardstick(workdir: Path) -> tuple[subprocess.Popen, str]:
    certs = workdir / "certs"
    port = free_port()
    process = subprocess.Popen([sys.executable, str(ROOT / "bench" / "yardstick.py"), str(certs / "tls.crt"),
                                str(certs / "tls.key"), str(port)])
    time.sleep(1.5)
    return process, f"https://127.0.0.1:{port}"


def measure(url: str, ca: str, bodies: list[bytes], seconds: float) -> dict:
    context = ssl.create_default_context(cafile=ca)
    result = asyncio.run(saturate(url + "/mutate", context, bodies, seconds))
    result["fixed"] = [asyncio.run(fixed_rate(url + "/mutate", context, bodies, r, seconds)) for r in RATES]
    return result


def versions() -> dict:
    import aiohttp as a
    return {"python": platform.python_version(), "aiohttp": a.__version__, "cpu": platform.processor() or
            platform.machine(), "cores": os.cpu_count(), "kernel": platform.release()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="trainhook-bench-"))
    hook = start_webhook(workdir)
    yard, yard_url = start_yardstick(workdir)
    cores = sorted(os.sched_getaffinity(0))
    for pid in (hook.process.pid, yard.pid):
        os.sched_setaffinity(pid, {cores[0]})
    if len(cores) > 1:
        os.sched_setaffinity(0, set(cores[1:]))
    try:
        small, large = gang_bodies(2), gang_bodies(1024)
        results = {
            "machine": versions(),
            "yardstick": measure(yard_url, str(hook.ca_file), small, args.seconds),
            "gang2": measure(hook.url, str(hook.ca_file), small, args.seconds),
            "gang1024": measure(hook.url, str(hook.ca_file), large, args.seconds),
        }
    finally:
        hook.stop()
        yard.terminate()
    y, g2, g1024 = (results[k]["throughput_rps"] for k in ("yardstick", "gang2", "gang1024"))
    results["ratios"] = {"gang2_vs_yardstick": g2 / y, "gang1024_cost_vs_gang2": g2 / g1024}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "admission.json").write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
