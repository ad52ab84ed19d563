"""Plain-request latency through `fairserve serve --redis` with its Redis healthy, frozen (SIGSTOP) and killed.

    .venv/bin/python -m experiments.redis_faults --rounds 3 --phase-s 5 --rate 10

One gateway process, its own redis-server on a free port, one tenant whose quota never denies (so every
request reserves and settles in Redis while it answers). Open-loop phases of `--phase-s` seconds at
`--rate` requests/s alternate healthy / frozen (and killed once at the end); after each fault Redis is
restored and the next phase starts only once /readyz no longer names it degraded. Reports each state's
p50/p90/p99 and status counts, keyed requests' statuses under the fault, the slowest /readyz at the
end of a phase, and the frozen/healthy ratios,
measured in the same run because this machine's speed drifts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from billing import BillingStore, Database, default_db_url
from experiments.gateway_overhead import Served, pct
from tests.redis_server import RedisServer


def _seed(data_dir: Path) -> str:
    db = Database(default_db_url(data_dir))
    db.upgrade()
    store = BillingStore(db)
    tenant = store.create_tenant("bench-metered", tokens_per_minute=10**9, tokens_per_day=10**12)
    key = store.create_key(tenant.id)[0]
    db.dispose()
    return key


async def _phase(c: httpx.AsyncClient, rate: float, seconds: float, keyed: int) -> dict[str, Any]:
    """Open loop: one request every 1/rate s for `seconds`; then `keyed` requests with an Idempotency-Key."""
    body = {"model": "fairserve-tiny", "prompt": "frozen?", "max_tokens": 2}

    async def one(headers: dict[str, str]) -> tuple[int, float]:
        t0 = time.perf_counter()
        resp = await c.post("/v1/completions", json=body, headers=headers)
        return resp.status_code, time.perf_counter() - t0

    start = time.perf_counter()
    tasks = []
    for i in range(int(rate * seconds)):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)  # pacing the open loop
        tasks.append(asyncio.create_task(one({})))
    plain = await asyncio.gather(*tasks)
    keyed_results = [await one({"Idempotency-Key": uuid.uuid4().hex}) for _ in range(keyed)]
    t0 = time.perf_counter()
    await c.get("/readyz")
    readyz_s = time.perf_counter() - t0
    latencies = [lat for _, lat in plain]
    return {
        "latencies": latencies,
        "statuses": Counter(s for s, _ in plain),
        "keyed_statuses": Counter(s for s, _ in keyed_results),
        "readyz_s": readyz_s,
    }


async def _until_healthy(c: httpx.AsyncClient, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready = (await c.get("/readyz")).json()
        if not ready["degraded"]:
            return
        await asyncio.sleep(0.1)  # polling readiness with a deadline
    raise RuntimeError("Redis breaker did not close")


def _summary(phases: list[dict[str, Any]]) -> dict[str, Any]:
    lat = [x for p in phases for x in p["latencies"]]
    statuses: Counter[int] = sum((p["statuses"] for p in phases), Counter())
    keyed: Counter[int] = sum((p["keyed_statuses"] for p in phases), Counter())
    return {
        "n": len(lat),
        "p50_ms": round(pct(lat, 0.5) * 1e3, 2),
        "p90_ms": round(pct(lat, 0.9) * 1e3, 2),
        "p99_ms": round(pct(lat, 0.99) * 1e3, 2),
        "max_ms": round(max(lat) * 1e3, 2),
        "readyz_max_ms": round(max(p["readyz_s"] for p in phases) * 1e3, 2),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "keyed_statuses": {str(k): v for k, v in sorted(keyed.items())},
    }


async def run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    redis = RedisServer(tmp / "redis")
    served = Served(str(tmp / "gw"), "--redis", redis.url, "--redis-timeout", str(args.redis_timeout))
    try:
        key = _seed(tmp / "gw")
        async with httpx.AsyncClient(
            base_url=served.url, timeout=60, headers={"Authorization": f"Bearer {key}"}
        ) as c:
            await _phase(c, args.rate, 2.0, 0)  # warm-up, unmeasured
            by_state: dict[str, list[dict[str, Any]]] = {"healthy": [], "frozen": [], "killed": []}
            for _ in range(args.rounds):
                by_state["healthy"].append(await _phase(c, args.rate, args.phase_s, args.keyed))
                redis.freeze()
                try:
                    by_state["frozen"].append(await _phase(c, args.rate, args.phase_s, args.keyed))
                finally:
                    redis.thaw()
                await _until_healthy(c)
            redis.kill()
            by_state["killed"].append(await _phase(c, args.rate, args.phase_s, args.keyed))
            redis.start()
            await _until_healthy(c)
        report = {state: _summary(phases) for state, phases in by_state.items()}
        healthy, frozen = report["healthy"], report["frozen"]
        report["ratio_frozen_over_healthy"] = {
            q: round(frozen[q] / healthy[q], 3) for q in ("p50_ms", "p90_ms")
        }
        report["settings"] = vars(args)
        return report
    finally:
        served.stop()
        redis.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--phase-s", type=float, default=5.0)
    parser.add_argument("--rate", type=float, default=10.0)
    parser.add_argument("--keyed", type=int, default=5, help="Idempotency-Key requests after each phase")
    parser.add_argument("--redis-timeout", type=float, default=0.25)
    parser.add_argument("--out", default=None, help="write the JSON report here too")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        report = asyncio.run(run(args, Path(tmp)))
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
