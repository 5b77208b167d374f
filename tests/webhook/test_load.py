"""A load test: 20,000 realistic pod reviews over 64 keep-alive connections; zero errors, memory flat."""

from __future__ import annotations

import asyncio
import json
import ssl

import aiohttp

from objects import pod_of_statefulset, review, statefulset
from trainhook.webhook.admission.mutate import mutate
from trainhook.webhook.settings import Settings
from webhook_process import start_webhook

CONNECTIONS, WARMUP, TOTAL = 64, 2_000, 20_000


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


async def hammer(url: str, ca_file: str, bodies: list[bytes], count: int) -> list[int]:
    context = ssl.create_default_context(cafile=ca_file)
    statuses: list[int] = []
    connector = aiohttp.TCPConnector(limit=CONNECTIONS, ssl=context)
    async with aiohttp.ClientSession(connector=connector) as session:
        async def worker(offset: int) -> None:
            for n in range(offset, count, CONNECTIONS):
                async with session.post(url, data=bodies[n % len(bodies)],
                                        headers={"Content-Type": "application/json"}) as reply:
                    payload = await reply.json()
                    ok = reply.status == 200 and payload["response"]["allowed"] is True
                    statuses.append(200 if ok else reply.status)
        await asyncio.gather(*(worker(i) for i in range(CONNECTIONS)))
    return statuses


def test_twenty_thousand_reviews_without_an_error_and_with_flat_memory(tmp_path):
    sts = mutate("StatefulSet", "CREATE", statefulset("load", 256), "team-a", Settings()).obj
    bodies = [json.dumps(review(pod_of_statefulset(sts, i))).encode() for i in range(256)]
    hook = start_webhook(tmp_path)
    try:
        warm = asyncio.run(hammer(hook.url + "/mutate", str(hook.ca_file), bodies, WARMUP))
        before = rss_kib(hook.process.pid)
        statuses = asyncio.run(hammer(hook.url + "/mutate", str(hook.ca_file), bodies, TOTAL))
        after = rss_kib(hook.process.pid)
    finally:
        hook.stop()
    assert warm.count(200) == WARMUP
    assert len(statuses) == TOTAL and statuses.count(200) == TOTAL, {s: statuses.count(s) for s in set(statuses)}
    assert after - before < 16 * 1024, f"RSS grew from {before} KiB to {after} KiB over {TOTAL} reviews"
