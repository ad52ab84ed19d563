"""The ledger's SQL: idempotent batch insert of usage rows plus the daily and task rollups, in one transaction.

Two paths. The common batch (every row new, the writer thread's case) is inserted without RETURNING and
without SQLAlchemy's per-row parameter work: one `executemany` of a constant statement on SQLite, a COPY
into a temporary table and one INSERT ... SELECT on PostgreSQL; the database's count of inserted rows says
whether every row was new, and then the rollup adds them all. When some were not (a replay, a duplicate
within the batch) the transaction is rolled back and the batch goes through the exact path: INSERT ...
RETURNING the keys stored, and the rollup of exactly those. Either way a row is counted once.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from dataclasses import fields
from datetime import UTC, datetime
from operator import attrgetter
from typing import Any, cast

import psycopg
from sqlalchemy import Connection, Engine, Table
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, SQLAlchemyError
from sqlalchemy.sql.dml import Insert

from billing.models import Base, UsageDailyRow, UsageRow
from billing.records import UsageRecord
from billing.scope_rollup import add_to_scopes

_FIELDS = tuple(f.name for f in fields(UsageRecord))
_SUMMED = (
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "charged_service",
    "tokens_after_cancel",
    "preemptions",
    "recomputed_tokens",
)
_USAGE: Table = Base.metadata.tables[UsageRow.__tablename__]
_DAILY: Table = Base.metadata.tables[UsageDailyRow.__tablename__]


def _insert(dialect: str) -> Any:
    return postgresql.insert if dialect == "postgresql" else sqlite.insert


_ROLLUP_KEY = attrgetter("finished_at", "tenant_id", "status")
_SUMMED_OF = attrgetter(*_SUMMED)


def _rollup(rows: list[UsageRecord]) -> list[dict[str, Any]]:
    groups: dict[tuple[Any, str, str], list[UsageRecord]] = defaultdict(list)
    for row in rows:
        finished, tenant, status = _ROLLUP_KEY(row)
        groups[(finished.date(), tenant, status)].append(row)
    # A fixed order keeps concurrent writers (several replicas) from deadlocking on the rollup rows.
    return [
        {
            "day": day,
            "tenant_id": tenant,
            "status": status,
            "requests": len(group),
            **dict(zip(_SUMMED, map(sum, zip(*map(_SUMMED_OF, group), strict=True)), strict=True)),
        }
        for (day, tenant, status), group in sorted(groups.items(), key=lambda kv: kv[0])
    ]


@functools.cache
def _rollup_upsert(dialect: str) -> Insert:
    """The rollup's upsert for a dialect, built once (the statement is constant)."""
    upsert = _insert(dialect)(_DAILY)
    statement: Insert = upsert.on_conflict_do_update(
        index_elements=["day", "tenant_id", "status"],
        set_={name: _DAILY.c[name] + upsert.excluded[name] for name in ("requests", *_SUMMED)},
    )
    return statement


def _add_to_rollup(conn: Connection, rows: list[UsageRecord]) -> None:
    conn.execute(_rollup_upsert(conn.dialect.name), _rollup(rows))
    add_to_scopes(conn, rows)


_PG_TYPES = {
    "attempt": "int4",
    "prompt_tokens": "int4",
    "cached_tokens": "int4",
    "completion_tokens": "int4",
    "tokens_after_cancel": "int4",
    "preemptions": "int4",
    "recomputed_tokens": "int4",
    "delivered_tokens": "int4",
    "dropped_tokens": "int4",
    "counted_by_gateway": "bool",
    "charged_service": "float8",
    "queue_ms": "float8",
    "ttft_ms": "float8",
    "e2e_ms": "float8",
    "created_at": "timestamptz",
    "finished_at": "timestamptz",
}
# One constant statement with one array per column: psycopg parses and PostgreSQL plans it once, where a
# multi-VALUES INSERT of 500 rows spends most of its time in client-side placeholder parsing.
_PG_ARRAYS = ", ".join("%s::" + _PG_TYPES.get(name, "text") + "[]" for name in _FIELDS)
_PG_INSERT = (
    f"INSERT INTO usage ({', '.join(_FIELDS)}) SELECT * FROM unnest({_PG_ARRAYS}) "
    "ON CONFLICT (tenant_id, request_id) DO NOTHING RETURNING tenant_id, request_id"
)
RowKey = tuple[str, str]  # (tenant_id, request_id): request ids are the caller's, unique per tenant only


def row_key(row: UsageRecord) -> RowKey:
    """The ledger's key of a usage row."""
    return row.tenant_id, row.request_id


def _insert_rows(conn: Connection, rows: list[UsageRecord]) -> set[RowKey]:
    if conn.dialect.name == "postgresql":
        columns = tuple([getattr(r, name) for r in rows] for name in _FIELDS)
        return {(r[0], r[1]) for r in conn.exec_driver_sql(_PG_INSERT, columns)}
    params = [{name: getattr(r, name) for name in _FIELDS} for r in rows]
    stmt = (
        sqlite.insert(_USAGE)
        .on_conflict_do_nothing(index_elements=["tenant_id", "request_id"])
        .returning(_USAGE.c.tenant_id, _USAGE.c.request_id)
    )
    return {(r[0], r[1]) for r in conn.execute(stmt, params)}


class _NotAllNew(Exception):
    """Raised inside the all-new path's transaction to roll it back: some row was stored already."""


_COLUMNS = ", ".join(_FIELDS)
_ROW_VALUES = attrgetter(*_FIELDS)
_CREATED_AT = _FIELDS.index("created_at")
assert _FIELDS[_CREATED_AT + 1] == "finished_at"  # _sqlite_params converts the two as one slice
_SQLITE_INSERT = (
    f"INSERT INTO usage ({_COLUMNS}) VALUES ({', '.join('?' * len(_FIELDS))}) "
    "ON CONFLICT (tenant_id, request_id) DO NOTHING"
)
# PostgreSQL: COPY (psycopg writes its rows in C) into a per-connection temporary table emptied at each
# commit or rollback, then one INSERT ... SELECT: a third of the unnest's client CPU.
_PG_STAGE = (
    "CREATE TEMP TABLE IF NOT EXISTS usage_incoming (LIKE usage INCLUDING DEFAULTS) ON COMMIT DELETE ROWS"
)
_PG_COPY = f"COPY usage_incoming ({_COLUMNS}) FROM STDIN"
_PG_FROM_STAGE = (
    f"INSERT INTO usage ({_COLUMNS}) SELECT {_COLUMNS} FROM usage_incoming "
    "ON CONFLICT (tenant_id, request_id) DO NOTHING"
)


def sqlite_datetime(value: datetime) -> str:
    """A datetime as `UTCDateTime` stores it on SQLite (naive UTC text, microseconds always written), in
    one C call where SQLAlchemy's processor formats a dict per value; tests/billing pins the two equal."""
    if value.tzinfo is UTC:  # the gateway's rows: drop the "+00:00"
        return value.isoformat(" ", "microseconds")[:-6]
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    return value.isoformat(" ", "microseconds")


def _sqlite_params(row: UsageRecord) -> tuple[Any, ...]:
    values: tuple[Any, ...] = _ROW_VALUES(row)
    at = _CREATED_AT
    return values[:at] + (sqlite_datetime(values[at]), sqlite_datetime(values[at + 1])) + values[at + 2 :]


def _copy_pg(conn: Connection, rows: list[UsageRecord]) -> int:
    conn.exec_driver_sql(_PG_STAGE)
    driver = cast("psycopg.Connection[Any]", conn.connection.driver_connection)  # db.py admits psycopg only
    try:
        with driver.cursor() as cur, cur.copy(_PG_COPY) as copy:
            for values in map(_ROW_VALUES, rows):
                copy.write_row(values)
    except psycopg.Error as exc:  # psycopg's own class: the ledger reads SQLAlchemy's (permanent() below)
        raise DBAPIError.instance(_PG_COPY, None, exc, psycopg.Error, dialect=conn.dialect) from exc
    return int(conn.exec_driver_sql(_PG_FROM_STAGE).rowcount)


def _insert_all_new(conn: Connection, rows: list[UsageRecord]) -> int:
    """Insert rows and add them all to the rollup; raises _NotAllNew when some were stored already."""
    if conn.dialect.name == "postgresql":
        inserted = _copy_pg(conn, rows)
    else:
        inserted = int(conn.exec_driver_sql(_SQLITE_INSERT, list(map(_sqlite_params, rows))).rowcount)
    if inserted != len(rows):
        raise _NotAllNew
    _add_to_rollup(conn, rows)
    return inserted


def insert_batch(conn: Connection, rows: list[UsageRecord]) -> int:
    """Insert rows not yet stored (ON CONFLICT (tenant_id, request_id) DO NOTHING) and add exactly those to the daily rollup.

    Returns how many rows were new. The caller owns the transaction.
    """
    unique: dict[RowKey, UsageRecord] = {}
    for row in rows:
        unique.setdefault(row_key(row), row)
    if not unique:
        return 0
    inserted = _insert_rows(conn, list(unique.values()))
    if not inserted:
        return 0
    _add_to_rollup(conn, [r for key, r in unique.items() if key in inserted])
    return len(inserted)


def permanent(exc: SQLAlchemyError) -> bool:
    """Errors a retry cannot fix (bad row data); everything else (connection, lock, missing table) is retried."""
    if isinstance(exc, (IntegrityError, DataError)):
        return True
    return not isinstance(exc, DBAPIError) and type(exc).__name__ == "StatementError"


def write_batch(engine: Engine, rows: list[UsageRecord]) -> int:
    """Store rows in one transaction (the all-new path first, else the exact one); returns how many were new."""
    if not rows:
        return 0
    try:
        with engine.begin() as conn:
            return _insert_all_new(conn, rows)
    except _NotAllNew:
        pass  # rolled back: nothing of it is stored
    with engine.begin() as conn:
        return insert_batch(conn, rows)
