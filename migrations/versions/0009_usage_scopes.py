"""usage_scopes: the task and workflow-run rollup the reports read; the task index keyed by tenant first.

GET /v1/tasks/{id} and GET /v1/workflow-runs/{id} aggregated every usage row of the task on each call
(about 60 ms of database time at 50,000 rows, issue 45); they now read this rollup, which the ledger keeps
in the same transaction as the rows (billing/ledger_sql.py). Existing rows are rolled up here. The index
`ix_usage_task (task_id)` becomes `ix_usage_tenant_task (tenant_id, task_id)`: a lookup that names another
tenant's task id then stops where an unknown id does.

Revision ID: 0009_usage_scopes
Revises: 0008_public_prefixes
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009_usage_scopes"
down_revision = "0008_public_prefixes"
branch_labels = None
depends_on = None

_OUTCOME = "CASE WHEN status = 'rejected' AND finish_reason = 'infeasible' THEN 'infeasible' ELSE status END"


def _backfill(kind: str, column: str) -> None:
    op.execute(
        "INSERT INTO usage_scopes (tenant_id, kind, scope_id, attempt, outcome, requests, engine_tokens, "
        f"tokens_after_cancel) SELECT tenant_id, '{kind}', {column}, attempt, {_OUTCOME}, count(*), "
        "sum(prompt_tokens - cached_tokens + completion_tokens), sum(tokens_after_cancel) FROM usage "
        f"WHERE {column} IS NOT NULL GROUP BY tenant_id, {column}, attempt, {_OUTCOME}"
    )


def upgrade() -> None:
    """Create and fill usage_scopes; re-key the task index on (tenant_id, task_id)."""
    op.create_table(
        "usage_scopes",
        sa.Column("tenant_id", sa.String(128), primary_key=True),
        sa.Column("kind", sa.String(8), primary_key=True),
        sa.Column("scope_id", sa.String(200), primary_key=True),
        sa.Column("attempt", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("outcome", sa.String(16), primary_key=True),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.Column("engine_tokens", sa.BigInteger(), nullable=False),
        sa.Column("tokens_after_cancel", sa.BigInteger(), nullable=False),
    )
    _backfill("task", "task_id")
    _backfill("run", "workflow_run_id")
    op.drop_index("ix_usage_task", table_name="usage")
    op.create_index("ix_usage_tenant_task", "usage", ["tenant_id", "task_id"])


def downgrade() -> None:
    """Drop usage_scopes; the task index as it was."""
    op.drop_index("ix_usage_tenant_task", table_name="usage")
    op.create_index("ix_usage_task", "usage", ["task_id"])
    op.drop_table("usage_scopes")
