"""The loop-lag bench runs the real Ledger on SQLite beside a real asyncio loop."""

from __future__ import annotations

import sys

from bench.diagnostics.loop_lag import measure


def test_every_segment_is_measured_every_row_lands_and_the_interval_is_restored() -> None:
    before = sys.getswitchinterval()
    report = measure(seconds=0.3, rows_per_s=400.0, rounds=1)
    assert sys.getswitchinterval() == before
    ledger = report.pop("ledger")
    assert ledger["rows_recorded"] >= 200 and ledger["rows_written"] == ledger["rows_recorded"]
    assert len(report) == 3 and all(v["n"] >= 50 for v in report.values())
    assert all(0 <= v["p50_ms"] <= v["p99_ms"] <= v["max_ms"] for v in report.values())
