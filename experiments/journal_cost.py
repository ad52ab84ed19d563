"""What the ledger journal costs per request, beside the gateway's own CPU per request, in one run.

    .venv/bin/python -m experiments.journal_cost --rounds 6 --rows 2000 --requests 400

Two measurements, interleaved so that the machine's drift hits both alike:

* `Ledger.record()` per row with the journal on and off (alternating rounds over one SQLite database,
  the writer thread running as in the gateway); the difference is the journal's cost on the event loop
  (JSON-encoding the row and one write()).
* The gateway's CPU per request: `fairserve serve` (engine worker in its own process) answers
  `--requests` non-streaming `max_tokens=1` requests at `--rate`; its process CPU time (utime + stime from
  /proc, every thread, the ledger writer included) over them, divided by their number.

The report gives both in µs and the journal's share of the request's gateway CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from billing import Database, Ledger, LedgerConfig, UsageRecord, default_db_url
from experiments.gateway_overhead import Served
from experiments.http1 import Http1Pool


def _row(i: int, run: str) -> UsageRecord:
    now = datetime.now(UTC)
    return UsageRecord(
        request_id=f"{run}-{i}",
        tenant_id="bench",
        api_key_id="k",
        task_id=None,
        workflow_run_id=None,
        attempt=0,
        model="fairserve-tiny",
        status="completed",
        finish_reason="length",
        cancel_state=None,
        prompt_tokens=7,
        cached_tokens=0,
        completion_tokens=1,
        charged_service=8.0,
        tokens_after_cancel=0,
        preemptions=0,
        recomputed_tokens=0,
        queue_ms=0.4,
        ttft_ms=3.1,
        e2e_ms=3.2,
        created_at=now,
        finished_at=now,
    )


def record_us(db: Database, tmp: Path, journal: bool, rows: int, run: str) -> float:
    """Mean µs per record() call over `rows` rows (paced 20 µs apart so the buffer never overflows)."""
    ledger = Ledger(
        db, LedgerConfig(spill_path=str(tmp / f"{run}.spill"), journal=journal), registry=CollectorRegistry()
    )
    ledger.start()
    batch = [_row(i, run) for i in range(rows)]
    spent = 0
    for row in batch:
        t0 = time.perf_counter_ns()
        ledger.record(row)
        spent += time.perf_counter_ns() - t0
        time.sleep(20e-6)
    ledger.close()
    return spent / rows / 1e3


async def _requests(served: Served, rate: float, n: int) -> int:
    pool = Http1Pool(served.url, served.headers)
    models = await pool.request("GET", "/v1/models")
    body = {"model": models.json()["data"][0]["id"], "prompt": "The batch never waits.", "max_tokens": 1}
    ok = 0

    async def one() -> None:
        nonlocal ok
        ok += (await pool.request("POST", "/v1/completions", body)).status == 200

    start, tasks = time.perf_counter(), []
    for i in range(n):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one()))
    await asyncio.gather(*tasks)
    await pool.close()
    return ok


def gateway_cpu_us(served: Served, rate: float, n: int) -> float:
    """The gateway process's CPU µs per answered request over `n` requests."""
    before = served.cpu_s()
    ok = asyncio.run(_requests(served, rate, n))
    return (served.cpu_s() - before) / max(1, ok) * 1e6


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Alternate the three measurements for `rounds` rounds."""
    on: list[float] = []
    off: list[float] = []
    cpu: list[float] = []
    with tempfile.TemporaryDirectory(prefix="fairserve-journal-") as name:
        tmp = Path(name)
        db = Database(default_db_url(tmp))
        db.upgrade()
        served = Served(str(tmp / "gateway"))
        try:
            asyncio.run(_requests(served, args.rate, 100))  # warm-up
            for r in range(args.rounds):
                first, second = (True, False) if r % 2 == 0 else (False, True)
                for journal in (first, second):
                    (on if journal else off).append(record_us(db, tmp, journal, args.rows, f"r{r}-{journal}"))
                cpu.append(gateway_cpu_us(served, args.rate, args.requests))
        finally:
            served.stop()
            db.dispose()
    journal_us = statistics.median(on) - statistics.median(off)
    gateway_us = statistics.median(cpu)
    return {
        "record_us_journal_on": on,
        "record_us_journal_off": off,
        "gateway_cpu_us_per_request": cpu,
        "journal_us_per_request": journal_us,
        "gateway_cpu_us_median": gateway_us,
        "journal_share_of_gateway_cpu": journal_us / gateway_us,
        "rows": args.rows,
        "requests": args.requests,
        "rate": args.rate,
    }


def main() -> None:
    """CLI entry point."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--rows", type=int, default=2000, help="rows recorded per ledger round")
    p.add_argument("--requests", type=int, default=400, help="gateway requests per round")
    p.add_argument("--rate", type=float, default=100.0, help="gateway requests per second")
    print(json.dumps(run(p.parse_args()), indent=2))


if __name__ == "__main__":
    main()
