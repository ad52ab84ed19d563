"""The ledger's SQL: idempotent batch insert of usage rows plus the daily rollup, in one transaction."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import fields
from typing import Any

from sqlalchemy import Connection, Engine, Table
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, SQLAlchemyError

from billing.models import Base, UsageDailyRow, UsageRow
from billing.records import UsageRecord

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


def _rollup(rows: list[UsageRecord]) -> list[dict[str, Any]]:
    totals: dict[tuple[Any, str, str], dict[str, Any]] = defaultdict(
        lambda: dict.fromkeys(("requests", *_SUMMED), 0)
    )
    for row in rows:
        acc = totals[(row.finished_at.date(), row.tenant_id, row.status)]
        acc["requests"] += 1
        for name in _SUMMED:
            acc[name] += getattr(row, name)
    # A fixed order keeps concurrent writers (several replicas) from deadlocking on the rollup rows.
    return [
        {"day": day, "tenant_id": tenant, "status": status, **acc}
        for (day, tenant, status), acc in sorted(
            totals.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])
        )
    ]


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
    insert = _insert(conn.dialect.name)
    rollup = _rollup([r for key, r in unique.items() if key in inserted])
    upsert = insert(_DAILY)
    upsert = upsert.on_conflict_do_update(
        index_elements=["day", "tenant_id", "status"],
        set_={name: _DAILY.c[name] + upsert.excluded[name] for name in ("requests", *_SUMMED)},
    )
    conn.execute(upsert, rollup)
    return len(inserted)


def permanent(exc: SQLAlchemyError) -> bool:
    """Errors a retry cannot fix (bad row data); everything else (connection, lock, missing table) is retried."""
    if isinstance(exc, (IntegrityError, DataError)):
        return True
    return not isinstance(exc, DBAPIError) and type(exc).__name__ == "StatementError"


def write_batch(engine: Engine, rows: list[UsageRecord]) -> int:
    """insert_batch in its own transaction; returns how many rows were new."""
    with engine.begin() as conn:
        return insert_batch(conn, rows)
