"""The ledger's journal: rows a killed process never wrote to SQL are stored by the next start, once."""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import signal
from pathlib import Path

from prometheus_client import CollectorRegistry
from sqlalchemy import text

from billing import Database, Ledger, LedgerConfig
from billing.journal import Journal
from billing.spill import decode_row, encode_line, encode_row
from tests.billing.test_ledger import make_row, wait_until


def _record_then_die(url: str, spill: str, n: int, ready: object) -> None:
    """Child: record n rows with a ledger that never gets to write SQL (huge interval), then SIGKILL itself."""
    db = Database(url)
    ledger = Ledger(
        db,
        LedgerConfig(spill_path=spill, flush_interval_s=3600, batch_size=10**6, buffer_size=n // 2),
        registry=CollectorRegistry(),
    )
    ledger.start()
    for i in range(n):
        ledger.record(make_row(i))  # half are buffered, half overflow to the spill file
    os.kill(os.getpid(), signal.SIGKILL)


def _rows(db: Database) -> tuple[int, int]:
    with db.engine.connect() as conn:
        rows = conn.execute(text("SELECT count(*) FROM usage")).scalar_one()
        daily = conn.execute(text("SELECT coalesce(sum(requests), 0) FROM usage_daily")).scalar_one()
    return int(rows), int(daily)


def test_kill_9_before_any_sql_write_loses_no_row(any_db: Database, tmp_path: Path) -> None:
    spill = tmp_path / "ledger.spill"
    url = any_db.url.render_as_string(hide_password=False)
    child = mp.get_context("spawn").Process(target=_record_then_die, args=(url, str(spill), 600, None))
    child.start()
    child.join(120)
    assert child.exitcode == -signal.SIGKILL
    assert _rows(any_db) == (0, 0)  # nothing reached SQL: the rows live only in the journal (and spill)
    assert list((tmp_path / "ledger.journal").glob("*.live"))
    restarted = Ledger(any_db, LedgerConfig(spill_path=str(spill)), registry=CollectorRegistry())
    restarted.start()  # replays the journal before returning
    assert _rows(any_db) == (600, 600)
    assert restarted.flush(timeout_s=30)  # the spill file's replay finds every row already stored
    restarted.close()
    assert _rows(any_db) == (600, 600)  # each row once, and the daily rollup counts it once
    assert not list((tmp_path / "ledger.journal").iterdir())


def test_journal_segments_are_released_once_stored(sqlite_db: Database, tmp_path: Path) -> None:
    config = LedgerConfig(
        spill_path=str(tmp_path / "ledger.spill"),
        flush_interval_s=0.05,
        batch_size=50,
        journal_segment_bytes=4096,
    )
    ledger = Ledger(sqlite_db, config, registry=CollectorRegistry())
    ledger.start()
    for i in range(500):
        ledger.record(make_row(i))
    assert ledger.flush(timeout_s=30)
    # Idle with everything stored: the writer closes the live segment and deletes every closed one.
    journal = tmp_path / "ledger.journal"
    assert wait_until(lambda: [p.suffix for p in journal.iterdir()] == [".lock"], 10)
    ledger.close()
    assert _rows(sqlite_db)[0] == 500


def test_same_request_id_in_two_tenants_is_two_rows(any_db: Database, tmp_path: Path) -> None:
    ledger = Ledger(any_db, LedgerConfig(spill_path=str(tmp_path / "s")), registry=CollectorRegistry())
    ledger.start()
    a = make_row(1)
    b = dataclasses.replace(a, tenant_id="other-tenant")
    ledger.record(a)
    ledger.record(b)
    ledger.record(dataclasses.replace(a))  # a true duplicate (same tenant, same id) is stored once
    assert ledger.flush(timeout_s=30)
    ledger.close()
    assert _rows(any_db) == (2, 2)
    with any_db.engine.begin() as conn:  # migration 0001 (the fixture downgrades to it) needs unique ids
        conn.execute(text("DELETE FROM usage WHERE tenant_id = 'other-tenant'"))


def test_rotate_keeps_a_segment_until_its_mark_is_stored(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j")
    journal.append(b'{"x":1}\n')
    journal.rotate(mark=3)
    journal.append(b'{"x":2}\n')
    journal.release(2)
    assert len(journal.files()) == 2
    journal.release(3)
    assert journal.files() == [journal.path]
    journal.discard()
    assert list((tmp_path / "j").iterdir()) == []


def test_a_live_owners_journal_is_not_a_leftover(tmp_path: Path) -> None:
    live = Journal(tmp_path / "j")
    live.append(b'{"x":1}\n')
    other = Journal(tmp_path / "j")
    assert other.leftovers() == []  # live holds its lock: its rows are not replayed (nor deleted) by others
    if live._fd:
        os.close(live._fd)
    os.close(live._lock_fd or -1)  # as if the process had died: the kernel drops its lock
    live._fd = live._lock_fd = None
    assert other.leftovers() == [live.path]
    other.forget_leftovers()
    assert not (tmp_path / "j" / f"{live.owner}.lock").exists()


def test_a_failing_journal_still_buffers_the_row(sqlite_db: Database, tmp_path: Path) -> None:
    ledger = Ledger(
        sqlite_db, LedgerConfig(spill_path=str(tmp_path / "ledger.spill")), registry=CollectorRegistry()
    )
    ledger.start()
    assert ledger.journal is not None
    full = os.open("/dev/full", os.O_WRONLY)  # a real device whose every write fails (ENOSPC)
    ledger.journal._fd = full
    ledger.record(make_row(1))
    assert ledger.metrics.journal_errors._value.get() == 1
    ledger.journal._fd = None
    os.close(full)
    assert ledger.flush(timeout_s=30)
    ledger.close()
    assert _rows(sqlite_db) == (1, 1)


def test_a_journal_line_decodes_to_the_row_it_encodes() -> None:
    row = dataclasses.replace(make_row(3), model="tiny-ü", task_id="täsk/1")
    line = encode_line(row)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert decode_row(line.decode("utf-8")) == row == decode_row(encode_row(row))
