"""usage.task_id and usage.workflow_run_id widen to 200 characters, the length the edge accepts.

The edge has accepted X-Task-Id and X-Workflow-Run-Id of up to 200 characters, but the columns held 128,
so PostgreSQL refused the row of a request that had been answered. Widening (rather than lowering the
edge's cap) keeps every client that worked working; on PostgreSQL widening a varchar rewrites nothing.
The widths are literals, as every migration's are: a migration is history. tests/billing/test_fields.py
checks the migrated schema against billing/fields.py.

Revision ID: 0004_wide_task_ids
Revises: 0003_tenant_request_ids
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_wide_task_ids"
down_revision = "0003_tenant_request_ids"
branch_labels = None
depends_on = None

_COLUMNS = ("task_id", "workflow_run_id")


def _resize(old: int, new: int) -> None:
    with op.batch_alter_table("usage") as batch:
        for name in _COLUMNS:
            batch.alter_column(
                name, type_=sa.String(new), existing_type=sa.String(old), existing_nullable=True
            )


def upgrade() -> None:
    """task_id and workflow_run_id: varchar(128) -> varchar(200)."""
    _resize(128, 200)


def downgrade() -> None:
    """Back to varchar(128) (fails on PostgreSQL while a longer id is stored, as it must)."""
    _resize(200, 128)
