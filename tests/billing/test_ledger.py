"""Write-behind ledger: 100,000 rows survive a database outage mid-run, exactly once, on both dialects."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import text

from billing import BillingStore, Database, Ledger, LedgerConfig, UsageRecord
from billing.spill import is_header
from tests.billing.services import PG_HOST, PG_PORT
from tests.billing.tcp_proxy import TcpProxy

STATUSES = ("completed", "cancelled", "deadline", "rejected", "error")
BASE = datetime(2026, 5, 1, 23, 59, 59, tzinfo=UTC)


def make_row(i: int, tenant: str = "t") -> UsageRecord:
    """A deterministic usage row; rows straddle midnight so the daily rollup gets two days."""
    status = STATUSES[i % len(STATUSES)]
    finished = BASE + timedelta(milliseconds=i * 2)
    return UsageRecord(
        request_id=f"req-{i}",
        tenant_id=f"{tenant}{i % 3}",
        api_key_id=None,
        task_id=f"task-{i % 10}",
        workflow_run_id=None,
        attempt=0,
        model="tiny",
        status=status,
        finish_reason="stop" if status == "completed" else status,
        cancel_state="decode" if status == "cancelled" else None,
        prompt_tokens=10 + i % 7,
        cached_tokens=i % 3,
        completion_tokens=i % 11,
        charged_service=0.5 * (i % 5),
        tokens_after_cancel=1 if status == "cancelled" else 0,
        preemptions=i % 2,
        recomputed_tokens=i % 4,
        queue_ms=1.0,
        ttft_ms=2.0,
        e2e_ms=3.0,
        created_at=finished - timedelta(seconds=1),
        finished_at=finished,
    )


def wait_until(predicate: Callable[[], bool], timeout_s: float) -> bool:
    """Poll a condition with a bounded deadline."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def counts(db: Database) -> tuple[int, int, int, int]:
    """(rows, distinct request ids, rollup requests, rollup prompt tokens)."""
    with db.engine.connect() as conn:
        rows, distinct = conn.execute(text("SELECT count(*), count(DISTINCT request_id) FROM usage")).one()
        daily, prompt = conn.execute(text("SELECT sum(requests), sum(prompt_tokens) FROM usage_daily")).one()
    return int(rows), int(distinct), int(daily or 0), int(prompt or 0)


def expected_prompt_tokens(n: int) -> int:
    return sum(10 + i % 7 for i in range(n))


def run_outage(
    db: Database, outage: Callable[[], None], recover: Callable[[], None], spill: Path, n: int
) -> Ledger:
    """Record n rows, cutting the database off at 20% and restoring it at 70%; returns the closed ledger."""
    registry = CollectorRegistry()
    config = LedgerConfig(
        buffer_size=5_000, batch_size=1_000, flush_interval_s=0.05, spill_path=str(spill), max_backoff_s=0.2
    )
    ledger = Ledger(db, config, registry=registry)
    ledger.start()
    for i in range(n):
        if i == n // 5:
            assert ledger.flush(timeout_s=60)
            outage()
        if i == n * 7 // 10:
            assert wait_until(
                lambda: (registry.get_sample_value("fairserve_ledger_retries_total") or 0) > 0, 10
            )
            recover()
        ledger.record(make_row(i))
    # Replays of rows already stored must not be stored (or rolled up) twice.
    for i in range(0, n, 97):
        ledger.record(make_row(i))
    assert ledger.flush(timeout_s=120), f"still pending: {ledger.pending}"
    ledger.close()
    assert (registry.get_sample_value("fairserve_ledger_spilled_rows_total") or 0) > 0
    assert (registry.get_sample_value("fairserve_ledger_replayed_rows_total") or 0) > 0
    assert (registry.get_sample_value("fairserve_ledger_duplicate_rows_total") or 0) >= len(range(0, n, 97))
    assert registry.get_sample_value("fairserve_ledger_buffer_depth") == 0
    assert not list(spill.parent.glob(spill.name + "*")), "spill files left behind"
    return ledger


N = 100_000


def test_sqlite_outage_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    path = tmp_path / "fairserve.db"
    db = Database(f"sqlite:///{path}?timeout=0.05")
    db.upgrade()
    blocker = sqlite3.connect(path, timeout=0, isolation_level=None)

    def outage() -> None:
        blocker.execute("BEGIN EXCLUSIVE")

    def recover() -> None:
        blocker.execute("COMMIT")

    run_outage(db, outage=outage, recover=recover, spill=tmp_path / "ledger.spill", n=N)
    assert counts(db) == (N, N, N, expected_prompt_tokens(N))


def test_postgresql_outage_loses_and_duplicates_nothing(pg_db: Database, tmp_path: Path) -> None:
    proxy = TcpProxy((PG_HOST, PG_PORT))
    proxy.open()
    url = pg_db.url.set(host="127.0.0.1", port=proxy.port, query={"connect_timeout": "2"})
    db = Database(url.render_as_string(hide_password=False))
    try:
        run_outage(db, outage=proxy.close, recover=proxy.open, spill=tmp_path / "ledger.spill", n=N)
    finally:
        proxy.close()
        db.dispose()
    assert counts(pg_db) == (N, N, N, expected_prompt_tokens(N))


def test_close_spills_and_the_next_start_replays(tmp_path: Path) -> None:
    path = tmp_path / "fairserve.db"
    db = Database(f"sqlite:///{path}?timeout=0.05")
    db.upgrade()
    spill = tmp_path / "ledger.spill"
    blocker = sqlite3.connect(path, timeout=0, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    ledger = Ledger(db, LedgerConfig(spill_path=str(spill), max_backoff_s=0.1), registry=CollectorRegistry())
    ledger.start()
    for i in range(2_000):
        ledger.record(make_row(i))
    ledger.close(timeout_s=0.5)  # the database is locked: everything must land in the spill file
    assert sum(1 for line in spill.open() if not is_header(line)) == 2_000
    blocker.execute("COMMIT")
    assert counts(db)[0] == 0
    ledger.record(make_row(5_000))  # a record after close is spilled, not dropped
    restarted = Ledger(db, LedgerConfig(spill_path=str(spill)), registry=CollectorRegistry())
    assert restarted.pending == 2_001
    restarted.start()
    assert restarted.flush(timeout_s=30)
    restarted.close()
    assert counts(db)[:3] == (2_001, 2_001, 2_001)


def test_store_summaries_read_the_ledger(any_db: Database, tmp_path: Path) -> None:
    ledger = Ledger(any_db, LedgerConfig(spill_path=str(tmp_path / "s")), registry=CollectorRegistry())
    ledger.start()
    for i in range(1_000):
        ledger.record(make_row(i))
    assert ledger.flush(timeout_s=30)
    ledger.close()
    store = BillingStore(any_db)
    summary = {s.tenant_id: s for s in store.usage_summary()}
    mine = [i for i in range(1_000) if i % 3 == 1]
    assert summary["t1"].requests == len(mine)
    assert summary["t1"].prompt_tokens == sum(10 + i % 7 for i in mine)
    assert summary["t1"].requests_by_status["cancelled"] == sum(1 for i in mine if i % 5 == 1)
    assert summary["t1"].tokens_after_cancel == summary["t1"].requests_by_status["cancelled"]
    later = store.usage_summary("t1", since=BASE + timedelta(seconds=1))
    assert later[0].requests == sum(1 for i in mine if i * 2 >= 1000)
    daily = store.daily_usage("t1")
    assert {d.day for d in daily} == {"2026-05-01", "2026-05-02"}
    assert sum(d.requests for d in daily) == len(mine)
    seven = make_row(7)
    assert store.usage_exists(seven.tenant_id, seven.request_id)
    assert not store.usage_exists("t0", seven.request_id)  # ids are scoped to the tenant
    assert not store.usage_exists(seven.tenant_id, "never-recorded")


def test_bad_status_is_refused_at_record(sqlite_db: Database, tmp_path: Path) -> None:
    ledger = Ledger(sqlite_db, LedgerConfig(spill_path=str(tmp_path / "s")), registry=CollectorRegistry())
    row = make_row(1)
    row.status = "finished"
    with pytest.raises(ValueError, match="status"):
        ledger.record(row)
    assert ledger.depth == 0
