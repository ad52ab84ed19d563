"""The ledger's batch insert: the all-new path and the exact one store and roll up each row once."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone

import pytest
from sqlalchemy import select, text
from sqlalchemy.dialects import sqlite
from sqlalchemy.exc import SQLAlchemyError

from billing import Database
from billing.ledger_sql import permanent, sqlite_datetime, write_batch
from billing.models import Base, UsageRow
from tests.billing.test_ledger import make_row


def test_sqlite_datetimes_are_written_as_sqlalchemy_writes_them() -> None:
    dialect = sqlite.dialect()
    column = Base.metadata.tables[UsageRow.__tablename__].c.created_at
    processor = column.type.dialect_impl(dialect).bind_processor(dialect)
    assert processor is not None
    for value in (
        datetime(2026, 5, 1, 23, 59, 59, 123456, tzinfo=UTC),
        datetime(2026, 5, 1, 23, 59, 59, tzinfo=UTC),  # no microseconds: still written
        datetime(2026, 5, 2, 1, 30, tzinfo=timezone(timedelta(hours=2))),  # another zone: stored as UTC
        datetime(2026, 5, 1, 8, 0, 0, 5),  # naive: taken as UTC
    ):
        assert sqlite_datetime(value) == processor(value)


def _daily(db: Database) -> dict[tuple[str, str], tuple[int, int]]:
    with db.engine.connect() as conn:
        rows = conn.execute(
            text("SELECT tenant_id, status, sum(requests), sum(prompt_tokens) FROM usage_daily GROUP BY 1, 2")
        )
        return {(t, s): (int(n), int(p)) for t, s, n, p in rows}


def test_new_stored_and_repeated_rows_are_stored_and_rolled_up_once(any_db: Database) -> None:
    rows = [make_row(i) for i in range(40)]
    assert write_batch(any_db.engine, rows[:25]) == 25  # every row new
    mixed = rows[20:] + [rows[30]]  # five stored already, one twice in the batch
    assert write_batch(any_db.engine, mixed) == 15
    assert write_batch(any_db.engine, rows) == 0
    expected: dict[tuple[str, str], tuple[int, int]] = {}
    for row in rows:
        n, p = expected.get((row.tenant_id, row.status), (0, 0))
        expected[(row.tenant_id, row.status)] = (n + 1, p + row.prompt_tokens)
    assert _daily(any_db) == expected
    with any_db.engine.connect() as conn:
        stored = conn.execute(select(UsageRow.request_id, UsageRow.created_at, UsageRow.finished_at)).all()
    assert {(r.request_id, r.created_at, r.finished_at) for r in rows} == set(stored)


def test_a_refused_batch_stores_nothing_and_the_next_one_goes_through(pg_db: Database) -> None:
    bad = [make_row(1), replace(make_row(2), task_id="t" * 300)]  # longer than the column
    with pytest.raises(SQLAlchemyError) as refused:
        write_batch(pg_db.engine, bad)
    assert permanent(refused.value)  # the ledger quarantines it rather than retrying forever
    assert _daily(pg_db) == {}
    assert write_batch(pg_db.engine, [make_row(1), make_row(3)]) == 2
