"""Token counts are never negative: the ledger quarantines such a row before its journal, a journal or
spill line holding one does not decode, and the database refuses one by CHECK constraint (migration 0010),
on SQLite and PostgreSQL."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import insert, text
from sqlalchemy.exc import IntegrityError

from billing import Database, Ledger, LedgerConfig
from billing.ledger_sql import write_batch
from billing.models import Base, UsageRow
from billing.records import TOKEN_COUNTS, UsageRecord, check_counts
from billing.spill import decode_row, encode_row
from tests.billing.old_schema import insert_as_stored
from tests.billing.test_ledger import make_row

USAGE = Base.metadata.tables[UsageRow.__tablename__]


def _negative(i: int, name: str, value: int = -1) -> UsageRecord:
    """make_row(i) with `name` set to `value`."""
    row = make_row(i)
    setattr(row, name, value)
    return row


def _count(db: Database) -> int:
    with db.engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM usage")).scalar_one())


def test_the_ledger_quarantines_a_negative_count_and_never_journals_it(
    sqlite_db: Database, tmp_path: Path
) -> None:
    ledger = Ledger(
        sqlite_db, LedgerConfig(spill_path=str(tmp_path / "ledger.spill")), registry=CollectorRegistry()
    )
    # Recorded before the writer starts, so no trim can delete a segment while the test reads the journal.
    for i, name in enumerate(TOKEN_COUNTS):
        ledger.record(_negative(i, name, -3))
    ledger.record(make_row(100))
    journal = b"".join(p.read_bytes() for p in (tmp_path / "ledger.journal").glob("*"))
    assert b"req-100" in journal  # the good row is journaled
    assert b"-3" not in journal  # the negative ones never are: no replay can store them
    ledger.start()
    try:
        assert ledger.flush(timeout_s=30)
        assert _count(sqlite_db) == 1  # only the good row
        reasons = sorted(e["reason"] for e in ledger.quarantine.entries())
        assert reasons == sorted(f"usage {name} must be >= 0, got -3" for name in TOKEN_COUNTS)
        assert ledger.quarantine.rows() == []  # and requeue never stores it either
    finally:
        ledger.close()


def test_a_journal_line_with_a_negative_count_does_not_decode() -> None:
    good = make_row(1)
    assert decode_row(encode_row(good)) == good
    for name in TOKEN_COUNTS:
        with pytest.raises(ValueError, match=name):
            decode_row(encode_row(_negative(1, name)))


def test_the_database_refuses_a_negative_count(any_db: Database) -> None:
    assert write_batch(any_db.engine, [dataclasses.replace(make_row(0), delivered_tokens=None)]) == 1
    for i, name in enumerate(TOKEN_COUNTS, 1):
        row = dataclasses.asdict(_negative(i, name))
        refused = pytest.raises(IntegrityError, match=f"ck_usage_{name}_nonnegative|CHECK constraint failed")
        with refused, any_db.engine.begin() as conn:
            conn.execute(insert(USAGE), [row])
        with pytest.raises(IntegrityError):  # the ledger's own fast path is refused too
            write_batch(any_db.engine, [_negative(i, name)])
    assert _count(any_db) == 1


def test_the_upgrade_stops_on_stored_negative_counts(any_db: Database) -> None:
    any_db.downgrade("0009_usage_scopes")
    row = dataclasses.asdict(dataclasses.replace(make_row(0), completion_tokens=-7))
    with any_db.engine.begin() as conn:
        insert_as_stored(conn, [row])
    with pytest.raises(RuntimeError, match="1 usage rows hold a negative token count"):
        any_db.upgrade()
    with any_db.engine.begin() as conn:
        conn.execute(text("UPDATE usage SET completion_tokens = 7"))
    any_db.upgrade()
    assert any_db.current_revision() == any_db.head_revision()


def test_the_database_refuses_a_negative_charge_and_the_ledger_never_journals_one(
    any_db: Database, tmp_path: Path
) -> None:
    """Issue 54: SQL accepted charged_service = -100. The CHECK constraint of migration 0012 refuses it on
    SQLite and PostgreSQL; the ledger quarantines such a row (or a NaN one) before its journal."""
    row = dataclasses.asdict(dataclasses.replace(make_row(0), charged_service=-100.0))
    refused = pytest.raises(
        IntegrityError, match="ck_usage_charged_service_nonnegative|CHECK constraint failed"
    )
    with refused, any_db.engine.begin() as conn:
        conn.execute(insert(USAGE), [row])
    assert write_batch(any_db.engine, [dataclasses.replace(make_row(1), charged_service=0.0)]) == 1
    for bad in (-1e-9, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="charged_service"):
            check_counts(dataclasses.replace(make_row(2), charged_service=bad))
    assert _count(any_db) == 1


def test_the_charge_upgrade_stops_on_stored_negative_charges(any_db: Database) -> None:
    any_db.downgrade("0012_counted_by_gateway")
    row = dataclasses.asdict(dataclasses.replace(make_row(0), charged_service=-100.0))
    with any_db.engine.begin() as conn:
        insert_as_stored(conn, [row])  # accepted before 0013, as the issue found
    with pytest.raises(RuntimeError, match="1 usage rows hold a negative charged_service"):
        any_db.upgrade()
    with any_db.engine.begin() as conn:
        conn.execute(text("UPDATE usage SET charged_service = 100"))
    any_db.upgrade()
    assert any_db.current_revision() == any_db.head_revision()
    with pytest.raises(IntegrityError), any_db.engine.begin() as conn:
        conn.execute(text("UPDATE usage SET charged_service = -1"))
    any_db.downgrade("0012_counted_by_gateway")  # and back: the constraint goes with the downgrade
    with any_db.engine.begin() as conn:
        conn.execute(text("UPDATE usage SET charged_service = -1"))
        conn.execute(text("UPDATE usage SET charged_service = 1"))
    any_db.upgrade()
