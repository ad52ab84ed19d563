"""An index on usage (tenant_id, workflow_run_id): GET /v1/workflow-runs/{id} reads one run's rows.

Revision ID: 0006_usage_workflow_run
Revises: 0005_delivered_tokens
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import op

revision = "0006_usage_workflow_run"
down_revision = "0005_delivered_tokens"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Index a tenant's rows by workflow run (task ids have theirs since 0001)."""
    op.create_index("ix_usage_workflow_run", "usage", ["tenant_id", "workflow_run_id"])


def downgrade() -> None:
    """Drop the index."""
    op.drop_index("ix_usage_workflow_run", table_name="usage")
