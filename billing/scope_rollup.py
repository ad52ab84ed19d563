"""The task and workflow-run rollup, added to in the ledger's write transaction (billing/ledger_sql.py).

One row per (tenant, task) and (tenant, run) in usage_scope_totals holds the whole report, so a report
reads one row whatever the task holds (issue 54: a report of a task with 50,000 distinct X-Attempt values
read 50,000 per-attempt rows, 234 ms against 9.6 ms with one attempt). Two numbers of the report are not
sums, and are kept so that every batch adds to them exactly:

- distinct attempts: each (tenant, kind, scope, attempt) is inserted into usage_scope_attempts with ON
  CONFLICT DO NOTHING RETURNING; only the attempts it returns are new, and only those are counted. Under
  PostgreSQL a concurrent writer's uncommitted insert of the same key makes the second wait and then
  conflict, so two replicas never both count one attempt.
- replaced tokens (completed attempts below the highest completed one): the totals keep every completed
  row's engine tokens, the highest completed attempt, and that attempt's tokens; a batch with a higher
  completed attempt replaces the kept pair, one with the same attempt adds to it. Replaced tokens are then
  `completed_tokens - kept_tokens`.

Rows are given in a fixed order (sorted keys), as the daily rollup's, so concurrent writers take the rollup
rows' locks in one order and cannot deadlock on them.
"""

from __future__ import annotations

import functools
from collections import Counter
from typing import Any

from sqlalchemy import Connection, Table, case
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql.dml import Insert

from billing.models import Base, UsageScopeAttemptRow, UsageScopeTotalRow
from billing.records import UsageRecord
from billing.tasks import INFEASIBLE, SUMMED

_TOTALS: Table = Base.metadata.tables[UsageScopeTotalRow.__tablename__]
_ATTEMPTS: Table = Base.metadata.tables[UsageScopeAttemptRow.__tablename__]
_KEY = ("tenant_id", "kind", "scope_id")
_COUNTED = {"completed": "completed", "cancelled": "cancelled", "deadline": "deadline"}
ScopeKey = tuple[str, str, str]  # (tenant_id, kind, scope_id)


def _insert(dialect: str) -> Any:
    return postgresql.insert if dialect == "postgresql" else sqlite.insert


def _scopes(row: UsageRecord) -> list[ScopeKey]:
    out = []
    if row.task_id is not None:
        out.append((row.tenant_id, "task", row.task_id))
    if row.workflow_run_id is not None:
        out.append((row.tenant_id, "run", row.workflow_run_id))
    return out


def _add(totals: dict[str, Any], row: UsageRecord) -> None:
    """One row's additions to its scope's totals (all but `attempts`)."""
    tokens = row.prompt_tokens - row.cached_tokens + row.completion_tokens
    totals["requests"] += 1
    totals["engine_tokens"] += tokens
    totals["tokens_after_cancel"] += row.tokens_after_cancel
    if row.status == "rejected" and row.finish_reason == INFEASIBLE:
        totals["rejected_infeasible"] += 1
    elif row.status in _COUNTED:
        totals[_COUNTED[row.status]] += 1
    if row.status == "cancelled":
        totals["cancelled_tokens"] += tokens
    elif row.status == "completed":
        totals["completed_tokens"] += tokens
        kept = totals["kept_attempt"]
        if kept is None or row.attempt > kept:
            totals["kept_attempt"], totals["kept_tokens"] = row.attempt, tokens
        elif row.attempt == kept:
            totals["kept_tokens"] += tokens


def batch_totals(rows: list[UsageRecord]) -> dict[ScopeKey, dict[str, Any]]:
    """The rows' totals per scope (`attempts` still 0: the database says which attempts are new)."""
    groups: dict[ScopeKey, dict[str, Any]] = {}
    for row in rows:
        for key in _scopes(row):
            totals = groups.get(key)
            if totals is None:
                totals = groups[key] = dict(zip(_KEY, key, strict=True))
                totals.update(dict.fromkeys(SUMMED, 0), kept_attempt=None, kept_tokens=0)
            _add(totals, row)
    return groups


@functools.cache
def _attempts_insert(dialect: str) -> Insert:
    statement: Insert = (
        _insert(dialect)(_ATTEMPTS)
        .on_conflict_do_nothing(index_elements=[*_KEY, "attempt"])
        .returning(*(_ATTEMPTS.c[name] for name in _KEY))
    )
    return statement


@functools.cache
def _totals_upsert(dialect: str) -> Insert:
    """Sums add; the kept attempt and its tokens follow the higher completed attempt (a NULL is none)."""
    upsert = _insert(dialect)(_TOTALS)
    new, old = upsert.excluded, _TOTALS.c
    higher = (old.kept_attempt.is_(None)) | (new.kept_attempt > old.kept_attempt)
    statement: Insert = upsert.on_conflict_do_update(
        index_elements=list(_KEY),
        set_={
            **{name: old[name] + new[name] for name in SUMMED},
            "kept_attempt": case((higher, new.kept_attempt), else_=old.kept_attempt),
            "kept_tokens": case(
                (new.kept_attempt.is_(None), old.kept_tokens),
                (higher, new.kept_tokens),
                (new.kept_attempt == old.kept_attempt, old.kept_tokens + new.kept_tokens),
                else_=old.kept_tokens,
            ),
        },
    )
    return statement


# PostgreSQL: one constant statement over one array per column (as billing/ledger_sql.py's usage insert),
# where SQLAlchemy's many-values RETURNING spent ~45 ms of client work on 1,000 new attempts.
_PG_ATTEMPTS = (
    "INSERT INTO usage_scope_attempts (tenant_id, kind, scope_id, attempt) "
    "SELECT * FROM unnest(%s::text[], %s::text[], %s::text[], %s::int4[]) "
    "ON CONFLICT (tenant_id, kind, scope_id, attempt) DO NOTHING RETURNING tenant_id, kind, scope_id"
)


def _new_attempts(conn: Connection, attempts: list[tuple[str, str, str, int]]) -> list[Any]:
    """Insert the attempts; the (tenant, kind, scope) of each one that was not stored yet."""
    if conn.dialect.name == "postgresql":
        return list(conn.exec_driver_sql(_PG_ATTEMPTS, tuple(map(list, zip(*attempts, strict=True)))))
    params = [dict(zip((*_KEY, "attempt"), values, strict=True)) for values in attempts]
    return list(conn.execute(_attempts_insert(conn.dialect.name), params))


def add_to_scopes(conn: Connection, rows: list[UsageRecord]) -> None:
    """Add newly stored rows to the task and run rollup: two statements, none when no row names a scope."""
    groups = batch_totals(rows)
    if not groups:  # most rows name no task or run
        return
    attempts = sorted({(*key, row.attempt) for row in rows for key in _scopes(row)})
    for key, count in Counter((r[0], r[1], r[2]) for r in _new_attempts(conn, attempts)).items():
        groups[key]["attempts"] = count
    conn.execute(_totals_upsert(conn.dialect.name), [groups[key] for key in sorted(groups)])
