"""usage_scope_totals and usage_scope_attempts replace usage_scopes: a report reads one row.

usage_scopes (0009) held a row per task, attempt and outcome, so a report of a task with 50,000 distinct
X-Attempt values read 50,000 rows (234 ms, against 9.6 ms with one attempt; issue 54). The ledger now keeps
one row per tenant and task (or run) with the whole report, and the attempt numbers seen, to count distinct
attempts as rows arrive (billing/scope_rollup.py). Both are filled here from the usage rows already stored.

Revision ID: 0014_usage_scope_totals
Revises: 0013_usage_service_nonnegative
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014_usage_scope_totals"
down_revision = "0013_usage_service_nonnegative"
branch_labels = None
depends_on = None

_TOKENS = "(prompt_tokens - cached_tokens + completion_tokens)"
_U_TOKENS = "(u.prompt_tokens - u.cached_tokens + u.completion_tokens)"
_INFEASIBLE = "status = 'rejected' AND finish_reason = 'infeasible'"
_SUMMED = (
    "attempts",
    "requests",
    "completed",
    "cancelled",
    "deadline",
    "rejected_infeasible",
    "engine_tokens",
    "tokens_after_cancel",
    "cancelled_tokens",
    "completed_tokens",
)


def _key_columns() -> list[sa.Column[str]]:
    return [
        sa.Column("tenant_id", sa.String(128), primary_key=True),
        sa.Column("kind", sa.String(8), primary_key=True),
        sa.Column("scope_id", sa.String(200), primary_key=True),
    ]


def _backfill(kind: str, column: str) -> None:
    """One scope kind's attempts and totals, from its usage rows."""
    op.execute(
        "INSERT INTO usage_scope_attempts (tenant_id, kind, scope_id, attempt) "
        f"SELECT DISTINCT tenant_id, '{kind}', {column}, attempt FROM usage WHERE {column} IS NOT NULL"
    )
    kept = (
        f"SELECT tenant_id, {column} AS scope_id, max(attempt) AS attempt FROM usage "
        f"WHERE {column} IS NOT NULL AND status = 'completed' GROUP BY tenant_id, {column}"
    )
    op.execute(
        f"INSERT INTO usage_scope_totals (tenant_id, kind, scope_id, {', '.join(_SUMMED)}, kept_attempt, "
        f"kept_tokens) SELECT u.tenant_id, '{kind}', u.{column}, count(DISTINCT u.attempt), count(*), "
        "sum(CASE WHEN u.status = 'completed' THEN 1 ELSE 0 END), "
        "sum(CASE WHEN u.status = 'cancelled' THEN 1 ELSE 0 END), "
        "sum(CASE WHEN u.status = 'deadline' THEN 1 ELSE 0 END), "
        f"sum(CASE WHEN u.status = 'rejected' AND u.finish_reason = 'infeasible' THEN 1 ELSE 0 END), sum({_U_TOKENS}), sum(u.tokens_after_cancel), "
        f"sum(CASE WHEN u.status = 'cancelled' THEN {_U_TOKENS} ELSE 0 END), "
        f"sum(CASE WHEN u.status = 'completed' THEN {_U_TOKENS} ELSE 0 END), max(k.attempt), "
        f"sum(CASE WHEN u.status = 'completed' AND u.attempt = k.attempt THEN {_U_TOKENS} ELSE 0 END) "
        f"FROM usage u LEFT JOIN ({kept}) k ON k.tenant_id = u.tenant_id AND k.scope_id = u.{column} "
        f"WHERE u.{column} IS NOT NULL GROUP BY u.tenant_id, u.{column}"
    )


def upgrade() -> None:
    """Create and fill the two tables; drop usage_scopes."""
    op.create_table(
        "usage_scope_totals",
        *_key_columns(),
        *(sa.Column(name, sa.BigInteger(), nullable=False) for name in _SUMMED),
        sa.Column("kept_attempt", sa.Integer(), nullable=True),
        sa.Column("kept_tokens", sa.BigInteger(), nullable=False),
    )
    op.create_table(
        "usage_scope_attempts",
        *_key_columns(),
        sa.Column("attempt", sa.Integer(), primary_key=True, autoincrement=False),
    )
    _backfill("task", "task_id")
    _backfill("run", "workflow_run_id")
    op.drop_table("usage_scopes")


def downgrade() -> None:
    """usage_scopes as 0009 made it, filled from the usage rows; drop the two tables."""
    outcome = f"CASE WHEN {_INFEASIBLE} THEN 'infeasible' ELSE status END"
    op.create_table(
        "usage_scopes",
        *_key_columns(),
        sa.Column("attempt", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("outcome", sa.String(16), primary_key=True),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.Column("engine_tokens", sa.BigInteger(), nullable=False),
        sa.Column("tokens_after_cancel", sa.BigInteger(), nullable=False),
    )
    for kind, column in (("task", "task_id"), ("run", "workflow_run_id")):
        op.execute(
            "INSERT INTO usage_scopes (tenant_id, kind, scope_id, attempt, outcome, requests, engine_tokens, "
            f"tokens_after_cancel) SELECT tenant_id, '{kind}', {column}, attempt, {outcome}, count(*), "
            f"sum({_TOKENS}), sum(tokens_after_cancel) FROM usage "
            f"WHERE {column} IS NOT NULL GROUP BY tenant_id, {column}, attempt, {outcome}"
        )
    op.drop_table("usage_scope_attempts")
    op.drop_table("usage_scope_totals")
