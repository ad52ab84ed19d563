"""Several models and degraded deadlines: usage.served_model, usage.degradation, usage.dropped_tokens, and
tenants.on_infeasible (a tenant's default X-On-Infeasible).

`served_model` is the model that answered (NULL on rows from before: their `model`); `degradation` is
fallback, partial or truncated (NULL: served as asked); `dropped_tokens` the prompt tokens truncation
removed. `on_infeasible` NULL means the server's default.

Revision ID: 0007_served_model
Revises: 0006_usage_workflow_run
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_served_model"
down_revision = "0006_usage_workflow_run"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add the three usage columns and the tenant's default."""
    with op.batch_alter_table("usage") as batch:
        batch.add_column(sa.Column("served_model", sa.String(128), nullable=True))
        batch.add_column(sa.Column("degradation", sa.String(16), nullable=True))
        batch.add_column(sa.Column("dropped_tokens", sa.Integer(), nullable=False, server_default="0"))
    with op.batch_alter_table("tenants") as batch:
        batch.add_column(sa.Column("on_infeasible", sa.String(16), nullable=True))


def downgrade() -> None:
    """Drop them."""
    with op.batch_alter_table("tenants") as batch:
        batch.drop_column("on_infeasible")
    with op.batch_alter_table("usage") as batch:
        batch.drop_column("dropped_tokens")
        batch.drop_column("degradation")
        batch.drop_column("served_model")
