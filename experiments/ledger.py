"""Ledger and quota benchmark: sustained rows/s through the write-behind ledger (SQLite, PostgreSQL),
the added request-path latency of record() (p50/p99), and quota reservations per second (memory, Redis).

    .venv/bin/python -m experiments.ledger --rows 50000 \\
        --pg postgresql+psycopg://postgres@127.0.0.1:5432/test --redis redis://127.0.0.1:6379/0
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from sqlalchemy import text

from admission.quota import MemoryQuota, QuotaLimits, QuotaStore
from admission.quota_redis import RedisQuota
from billing import Database, Ledger, LedgerConfig, UsageRecord
from gateway.settings import GatewaySettings


def _row(run: str, i: int, now: datetime) -> UsageRecord:
    return UsageRecord(
        request_id=f"bench-{run}-{i}",
        tenant_id=f"tenant-{i % 8}",
        api_key_id=None,
        task_id=None,
        workflow_run_id=None,
        attempt=0,
        model="bench",
        status="completed",
        finish_reason="stop",
        cancel_state=None,
        prompt_tokens=128,
        cached_tokens=32,
        completion_tokens=64,
        charged_service=192.0,
        tokens_after_cancel=0,
        preemptions=0,
        recomputed_tokens=0,
        queue_ms=1.5,
        ttft_ms=20.0,
        e2e_ms=300.0,
        created_at=now,
        finished_at=now,
    )


def _percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def bench_ledger(url: str, rows: int, spill_dir: Path) -> dict[str, Any]:
    """Record `rows` rows as fast as possible; time until all are stored, and each record() call."""
    db = Database(url)
    db.upgrade()
    run = uuid.uuid4().hex[:8]
    registry = CollectorRegistry()
    ledger = Ledger(db, LedgerConfig(spill_path=str(spill_dir / f"{run}.spill")), registry=registry)
    ledger.start()
    now = datetime.now(UTC)
    prepared = [_row(run, i, now) for i in range(rows)]
    latencies: list[float] = []
    clock = time.perf_counter_ns
    started = time.perf_counter()
    for row in prepared:
        t0 = clock()
        ledger.record(row)
        latencies.append((clock() - t0) / 1000.0)
    recorded = time.perf_counter() - started
    ok = ledger.flush(timeout_s=600)
    elapsed = time.perf_counter() - started
    ledger.close()
    with db.engine.connect() as conn:
        stored = conn.execute(
            text("SELECT count(*) FROM usage WHERE request_id LIKE :p"), {"p": f"bench-{run}-%"}
        ).scalar()
        conn.execute(text("DELETE FROM usage WHERE request_id LIKE :p"), {"p": f"bench-{run}-%"})
        conn.commit()
    db.dispose()
    latencies.sort()
    return {
        "dialect": db.dialect,
        "rows": rows,
        "stored": stored,
        "flushed": ok,
        "rows_per_s": round(rows / elapsed),
        "record_calls_per_s": round(rows / recorded),
        "record_p50_us": round(_percentile(latencies, 0.50), 2),
        "record_p99_us": round(_percentile(latencies, 0.99), 2),
        "record_mean_us": round(statistics.fmean(latencies), 2),
        "spilled_rows": registry.get_sample_value("fairserve_ledger_spilled_rows_total"),
    }


def bench_paced_latency(url: str, rate: float, seconds: float, spill_dir: Path) -> dict[str, Any]:
    """record() latency at a steady request-completion rate (the serving case), with the writer running."""
    db = Database(url)
    db.upgrade()
    run = uuid.uuid4().hex[:8]
    registry = CollectorRegistry()
    ledger = Ledger(db, LedgerConfig(spill_path=str(spill_dir / f"{run}.spill")), registry=registry)
    ledger.start()
    now = datetime.now(UTC)
    total = int(rate * seconds)
    prepared = [_row(run, i, now) for i in range(total)]
    latencies: list[float] = []
    clock = time.perf_counter_ns
    interval_ns = int(1e9 / rate)
    next_at = clock()
    for row in prepared:
        while clock() < next_at:
            pass
        next_at += interval_ns
        t0 = clock()
        ledger.record(row)
        latencies.append((clock() - t0) / 1000.0)
    ok = ledger.flush(timeout_s=120)
    ledger.close()
    with db.engine.begin() as conn:
        conn.execute(text("DELETE FROM usage WHERE request_id LIKE :p"), {"p": f"bench-{run}-%"})
    db.dispose()
    latencies.sort()
    return {
        "dialect": db.dialect,
        "rate_per_s": rate,
        "rows": total,
        "flushed": ok,
        "record_p50_us": round(_percentile(latencies, 0.50), 2),
        "record_p99_us": round(_percentile(latencies, 0.99), 2),
        "record_max_us": round(latencies[-1], 2),
        "spilled_rows": registry.get_sample_value("fairserve_ledger_spilled_rows_total"),
    }


def bench_quota(make: Callable[[], QuotaStore], seconds: float) -> dict[str, Any]:
    """Reserve-then-settle pairs per second for one tenant with a quota that never runs out (one task)."""

    async def pairs() -> dict[str, Any]:
        quota = make()
        limits = QuotaLimits(tokens_per_minute=10**12, tokens_per_day=10**13)
        tenant = f"bench-{uuid.uuid4().hex[:8]}"
        n = 0
        started = time.perf_counter()
        deadline = started + seconds
        while time.perf_counter() < deadline:
            decision = await quota.reserve(tenant, 100, limits)
            await quota.settle(tenant, decision.reservation_id, 60, limits)
            n += 1
        elapsed = time.perf_counter() - started
        await quota.close()
        return {"backend": type(quota).__name__, "reserve_settle_per_s": round(n / elapsed)}

    return asyncio.run(pairs())


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print one JSON document."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--pg", default=None, help="PostgreSQL URL (skipped when not given)")
    parser.add_argument("--redis", default=None, help="Redis URL (skipped when not given)")
    parser.add_argument("--quota-seconds", type=float, default=3.0)
    parser.add_argument("--rate", type=float, default=2_000.0, help="paced record() rate for the latency run")
    parser.add_argument("--paced-seconds", type=float, default=5.0)
    args = parser.parse_args(argv)
    results: dict[str, Any] = {"ledger": [], "paced_record": [], "quota": []}
    with tempfile.TemporaryDirectory() as tmp:
        results["ledger"].append(bench_ledger(f"sqlite:///{Path(tmp) / 'bench.db'}", args.rows, Path(tmp)))
        if args.pg:
            results["ledger"].append(bench_ledger(args.pg, args.rows, Path(tmp)))
        for url in [f"sqlite:///{Path(tmp) / 'bench.db'}", *([args.pg] if args.pg else [])]:
            results["paced_record"].append(bench_paced_latency(url, args.rate, args.paced_seconds, Path(tmp)))
    results["quota"].append(bench_quota(MemoryQuota, args.quota_seconds))
    if args.redis:
        url = args.redis
        results["quota"].append(
            bench_quota(
                lambda: RedisQuota(
                    url,
                    namespace=f"bench-{uuid.uuid4().hex[:8]}",
                    registry=CollectorRegistry(),
                    timeout_s=GatewaySettings().redis_timeout_s,
                ),
                args.quota_seconds,
            )
        )
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
