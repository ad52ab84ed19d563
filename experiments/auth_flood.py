"""A paying tenant's latency beside a flood of bad API keys, as a ratio to the same tenant alone.

    .venv/bin/python -m experiments.auth_flood --flood-rate 360 --rounds 4 --phase 4

Starts `fairserve serve` (a subprocess, engine worker in its own process), then alternates phases in one
run: the paying tenant alone, then the same paying traffic (open loop, `--rate` req/s, `max_tokens=1`,
the demo key) while a separate flood process sends `--flood-rate` requests/s, each with a fresh random
well-formed key that no cache can know (the costliest bad key: only the store can refuse it). Alternating
A/B phases in one run keeps the machine's drift out of the ratio. The report is the median latency of the
paying requests in each condition, pooled over the rounds, and their ratio (target <= 1.5), plus what the
flood got back (401 while the address has budget, then 429). `--auth-failure-burst` passes through to the
server: a huge value (`1000000000`) turns the per-address budget off, leaving only the off-loop lookups
and the negative cache.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import statistics
import tempfile
import time
from collections import Counter
from typing import Any

from billing.keys import generate_secret
from experiments.gateway_overhead import Served
from experiments.http1 import Http1Pool


def _flood(url: str, rate: float, on: Any, done: Any, counts: Any) -> None:
    """Flood process: while `on` is set, POST at `rate`/s with a new random key each time."""

    async def main() -> None:
        pool = Http1Pool(url)
        statuses: Counter[int] = Counter()
        tasks: set[asyncio.Task[None]] = set()

        async def one() -> None:
            try:
                reply = await pool.request(
                    "POST",
                    "/v1/completions",
                    {"model": "x", "prompt": "x", "max_tokens": 1},
                    {"Authorization": f"Bearer {generate_secret()}"},
                )
                statuses[reply.status] += 1
            except (ConnectionError, asyncio.IncompleteReadError):
                statuses[0] += 1

        while not done.is_set():
            if not on.is_set():
                await asyncio.sleep(0.02)
                continue
            start, sent = time.perf_counter(), 0
            while on.is_set():
                delay = start + sent / rate - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                task = asyncio.create_task(one())
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                sent += 1
        await asyncio.gather(*tasks)
        counts.update({str(k): v for k, v in statuses.items()})
        await pool.close()

    asyncio.run(main())


async def _paying(served: Served, rate: float, seconds: float) -> list[float]:
    """Open-loop paying requests for `seconds`; their latencies (s) of 200 replies."""
    pool = Http1Pool(served.url, served.headers)
    models = await pool.request("GET", "/v1/models")
    if models.status != 200:
        raise RuntimeError(f"GET /v1/models: {models.status} {models.body!r}")
    model = models.json()["data"][0]["id"]
    body = {"model": model, "prompt": "The batch never waits.", "max_tokens": 1}
    latencies: list[float] = []

    async def one() -> None:
        t0 = time.perf_counter()
        reply = await pool.request("POST", "/v1/completions", body)
        if reply.status == 200:
            latencies.append(time.perf_counter() - t0)

    start, tasks = time.perf_counter(), []
    for i in range(int(rate * seconds)):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one()))
    await asyncio.gather(*tasks)
    await pool.close()
    return latencies


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The alternating measurement; returns the report."""
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="fairserve-authflood-") as tmp:
        served = Served(tmp, "--auth-failure-burst", str(args.auth_failure_burst))
        on, done, counts = ctx.Event(), ctx.Event(), ctx.Manager().dict()
        flood = ctx.Process(target=_flood, args=(served.url, args.flood_rate, on, done, counts), daemon=True)
        flood.start()
        alone: list[float] = []
        flooded: list[float] = []
        rounds: list[dict[str, float]] = []
        flood_s = 0.0
        try:
            asyncio.run(_paying(served, args.rate, 2.0))  # warm-up, unmeasured
            for _ in range(args.rounds):
                a = asyncio.run(_paying(served, args.rate, args.phase))
                on.set()
                flood_start = time.perf_counter()
                time.sleep(0.5)  # let the flood reach its rate before measuring beside it
                b = asyncio.run(_paying(served, args.rate, args.phase))
                on.clear()
                flood_s += time.perf_counter() - flood_start
                alone += a
                flooded += b
                rounds.append(
                    {"alone_p50_ms": statistics.median(a) * 1e3, "flood_p50_ms": statistics.median(b) * 1e3}
                )
        finally:
            on.clear()
            done.set()
            flood.join(60)
            served.stop()
        flood_replies = dict(counts)
    ratio = statistics.median(flooded) / statistics.median(alone)
    return {
        "rate": args.rate,
        "flood_rate": args.flood_rate,
        "rounds": rounds,
        "auth_failure_burst": args.auth_failure_burst,
        "alone_p50_ms": statistics.median(alone) * 1e3,
        "flood_p50_ms": statistics.median(flooded) * 1e3,
        "ratio": ratio,
        "n_alone": len(alone),
        "n_flood": len(flooded),
        "flood_replies": flood_replies,
        "flood_sent_per_s": sum(flood_replies.values()) / flood_s,
    }


def main() -> None:
    """CLI entry point."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", type=float, default=20.0, help="paying requests per second")
    p.add_argument("--flood-rate", type=float, default=360.0, help="bad-key requests per second")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--phase", type=float, default=4.0, help="seconds per phase")
    p.add_argument("--auth-failure-burst", type=int, default=20, help="passed to the server")
    args = p.parse_args()
    print(json.dumps(run(args), indent=2))


if __name__ == "__main__":
    main()
