"""CPU per usage row of the ledger's parts, in isolation, alternating this checkout with another one.

    .venv/bin/python -m experiments.ledger_cost --rounds 4 --against /work/main \\
        --pg postgresql+psycopg://postgres@127.0.0.1:5432/test

Each round runs every checkout in turn (order reversed every other round) in a subprocess of its own, whose
`billing` package is that checkout's (PYTHONPATH). What a round measures, as CPU time (not wall time, so a
busy machine stretches neither side), in µs per row:

* `encode`: the journal line of one row (`billing.spill.encode_line`);
* `record`: `Ledger.record()` with the journal on, the writer thread not started: what the event loop pays
  per answered request (the line's encode, the lock, the journal's write(), the buffer);
* `sql_sqlite` / `sql_pg`: `billing.ledger_sql.write_batch` of `--batch` new rows, this thread's CPU (the
  database server's own is not counted; `--pg` names a server, on which a database of its own is created
  and dropped);
* `ledger`: the whole ledger as the gateway runs it, journal and writer thread included: `--rows` rows
  recorded in bursts of 50 every 50 ms (1,000 rows/s), then flushed; the process's CPU per row.

The report is the median of the rounds per checkout and the ratio this/other of each round.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

PARTS = ("encode", "record", "sql_sqlite", "sql_pg", "ledger")


def _rows(n: int, run: str) -> list[Any]:
    from billing import UsageRecord

    now = datetime.now(UTC)
    return [
        UsageRecord(
            request_id=f"req-{run}-{i}",
            tenant_id="tenant-bench",
            api_key_id="3c1b2a9e-0d4f-4e39-9b8a-5c0f1e2d3a4b",
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
            queue_ms=0.41,
            ttft_ms=3.12,
            e2e_ms=3.2,
            created_at=now,
            finished_at=now,
            delivered_tokens=0,
            served_model="fairserve-tiny",
            degradation=None,
            dropped_tokens=0,
        )
        for i in range(n)
    ]


def _cpu_us_per(n: int, start: float) -> float:
    return (time.thread_time() - start) / n * 1e6


@contextlib.contextmanager
def _fresh_pg(server: str) -> Iterator[str]:
    """A database of its own on the PostgreSQL server of URL `server`, dropped on exit."""
    import psycopg
    from sqlalchemy.engine import make_url

    url = make_url(server)
    name = f"fairserve_ledger_cost_{uuid.uuid4().hex[:12]}"
    admin = url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield url.set(database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def one(args: argparse.Namespace) -> dict[str, float]:
    """One checkout's measurements (run in a subprocess whose PYTHONPATH is that checkout)."""
    from prometheus_client import CollectorRegistry

    from billing import Database, Ledger, LedgerConfig, default_db_url
    from billing.ledger_sql import write_batch
    from billing.spill import encode_line

    out: dict[str, float] = {}
    run = uuid.uuid4().hex[:8]
    with tempfile.TemporaryDirectory(prefix="fairserve-ledger-cost-") as name:
        tmp = Path(name)
        rows = _rows(args.rows, run)
        start = time.thread_time()
        for row in rows:
            encode_line(row)
        out["encode"] = _cpu_us_per(len(rows), start)

        db = Database(default_db_url(tmp))
        db.upgrade()
        config = LedgerConfig(spill_path=str(tmp / "r.spill"), buffer_size=len(rows) + 1, batch_size=10**6)
        ledger = Ledger(db, config, registry=CollectorRegistry())
        start = time.thread_time()
        for row in rows:
            ledger.record(row)
        out["record"] = _cpu_us_per(len(rows), start)
        assert ledger.journal is not None
        ledger.journal.discard()

        batches = [rows[i : i + args.batch] for i in range(0, len(rows), args.batch)]
        start = time.thread_time()
        for batch in batches:
            assert write_batch(db.engine, batch) == len(batch)
        out["sql_sqlite"] = _cpu_us_per(len(rows), start)
        if args.pg:
            with _fresh_pg(args.pg) as url:
                pg = Database(url)
                pg.upgrade()
                start = time.thread_time()
                for batch in batches:
                    assert write_batch(pg.engine, batch) == len(batch)
                out["sql_pg"] = _cpu_us_per(len(rows), start)
                pg.dispose()

        live = _rows(args.rows, run + "live")
        config = LedgerConfig(spill_path=str(tmp / "l.spill"))
        ledger = Ledger(db, config, registry=CollectorRegistry())
        ledger.start()
        start = time.process_time()
        for i in range(0, len(live), 50):
            for row in live[i : i + 50]:
                ledger.record(row)
            time.sleep(0.05)
        assert ledger.flush(30.0)
        out["ledger"] = (time.process_time() - start) / len(live) * 1e6
        ledger.close()
        db.dispose()
    return out


def main() -> None:
    """CLI entry point: alternate the checkouts for `--rounds` rounds, print medians and ratios as JSON."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--rows", type=int, default=5000, help="rows per measurement")
    p.add_argument("--batch", type=int, default=500, help="rows per SQL batch (the ledger's batch_size)")
    p.add_argument("--pg", default=None, help="a PostgreSQL URL for sql_pg (rows are deleted after)")
    p.add_argument("--against", default=None, help="another checkout, measured in the same rounds")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(one(args)))
        return
    # Here, not at the top: a measurement (`--one`) runs with the other checkout first on the path, which
    # may not have this module.
    from experiments.alternate import alternate

    flags = ["--rows", str(args.rows), "--batch", str(args.batch), *(["--pg", args.pg] if args.pg else [])]
    samples = alternate(__file__, flags, args.rounds, args.against)
    report: dict[str, Any] = {
        name: {k: round(statistics.median(s[k] for s in rounds), 2) for k in PARTS if k in rounds[0]}
        for name, rounds in samples.items()
    }
    if args.against:
        report["this/other by round"] = {
            k: [round(a[k] / b[k], 2) for a, b in zip(samples["this"], samples["other"], strict=True)]
            for k in PARTS
            if k in samples["this"][0]
        }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
