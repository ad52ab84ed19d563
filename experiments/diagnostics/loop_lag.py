"""How late the gateway's event loop wakes while the ledger writes behind it, at two GIL switch intervals.

    .venv/bin/python -m experiments.diagnostics.loop_lag --seconds 6 --rows-per-s 1000 --rounds 2

The ledger writer is a thread of the gateway process. While it runs SQLAlchemy's Python code it
holds the GIL, and CPython makes a running thread hand the GIL to a waiting one only once per switch
interval (5 ms by default). This runs the real Ledger on SQLite, fed at a fixed row rate from an
asyncio loop whose probe task sleeps 1 ms over and over, and reports how late the probe wakes: with
CPython's default interval, with the gateway's (`GatewaySettings.switch_interval_ms`) and, as the
floor, with no ledger at all. Segments alternate within one run, so machine drift hits all of them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime

from billing import BillingStore, Database, Ledger, LedgerConfig, UsageRecord, default_db_url
from experiments.diagnostics.jitter import pct
from gateway.settings import GatewaySettings

CPYTHON_DEFAULT_S = 0.005


def usage_row(tenant_id: str) -> UsageRecord:
    """One plausible finished request."""
    now = datetime.now(UTC)
    return UsageRecord(
        uuid.uuid4().hex,
        tenant_id,
        None,
        None,
        None,
        1,
        "bench",
        "completed",
        "length",
        None,
        5,
        0,
        1,
        6.0,
        0,
        0,
        0,
        1.0,
        2.0,
        3.0,
        now,
        now,
    )


async def _segment(
    ledger: Ledger | None,
    tenant_id: str,
    seconds: float,
    rows_per_s: float,
) -> tuple[list[float], int]:
    """Lateness (s) of repeated 1 ms sleeps while rows are recorded at `rows_per_s` on this loop, and how
    many rows were recorded."""
    late: list[float] = []
    end = time.perf_counter() + seconds
    start = time.perf_counter()
    recorded = 0
    while (now := time.perf_counter()) < end:
        if ledger is not None:
            while recorded < (now - start) * rows_per_s:  # what the gateway does as requests end
                ledger.record(usage_row(tenant_id))
                recorded += 1
        t = time.perf_counter()
        await asyncio.sleep(0.001)
        late.append(time.perf_counter() - t - 0.001)
    return late, recorded


def measure(seconds: float, rows_per_s: float, rounds: int) -> dict[str, dict[str, float]]:
    """Lateness percentiles (ms) per segment kind, and how many rows were recorded and reached SQL."""
    gateway_s = GatewaySettings().switch_interval_ms / 1e3
    kinds = {
        "no ledger": (False, gateway_s),
        f"ledger, switch {CPYTHON_DEFAULT_S * 1e3:g} ms": (True, CPYTHON_DEFAULT_S),
        f"ledger, switch {gateway_s * 1e3:g} ms": (True, gateway_s),
    }
    before = sys.getswitchinterval()
    late: dict[str, list[float]] = {k: [] for k in kinds}
    recorded = 0
    with tempfile.TemporaryDirectory() as tmp:
        db = Database(default_db_url(tmp))
        db.upgrade()
        tenant = BillingStore(db).create_tenant("bench").id
        try:
            for _ in range(rounds):
                for kind, (with_ledger, interval) in kinds.items():
                    sys.setswitchinterval(interval)
                    ledger = Ledger(db, LedgerConfig(data_dir=tmp)) if with_ledger else None
                    if ledger is not None:
                        ledger.start()
                    lateness, rows = asyncio.run(_segment(ledger, tenant, seconds, rows_per_s))
                    late[kind] += lateness
                    recorded += rows
                    if ledger is not None:
                        ledger.close()
        finally:
            sys.setswitchinterval(before)
        written = sum(s.requests for s in BillingStore(db).usage_summary())
        db.dispose()
    report: dict[str, dict[str, float]] = {
        kind: {
            "p50_ms": pct(v, 0.5) * 1e3,
            "p99_ms": pct(v, 0.99) * 1e3,
            "p999_ms": pct(v, 0.999) * 1e3,
            "max_ms": max(v) * 1e3,
            "n": len(v),
        }
        for kind, v in late.items()
    }
    report["ledger"] = {"rows_recorded": recorded, "rows_written": written}
    return report


def main() -> None:
    """Parse flags, run, print JSON."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=6.0, help="length of each segment")
    p.add_argument("--rows-per-s", type=float, default=1000.0, help="ledger rows recorded per second")
    p.add_argument("--rounds", type=int, default=2, help="times each segment kind runs, alternating")
    args = p.parse_args()
    print(json.dumps(measure(args.seconds, args.rows_per_s, args.rounds), indent=2))


if __name__ == "__main__":
    main()
