"""usage.delivered_tokens: the completion tokens handed to the client, kept beside those produced.

What is billed is completion_tokens, the tokens the engine produced; a client that disconnects mid-stream
received fewer. The column says how many (NULL where unknown: rows from before it, and requests billed
from an engine's record after their gateway died).

Revision ID: 0005_delivered_tokens
Revises: 0004_wide_task_ids
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_delivered_tokens"
down_revision = "0004_wide_task_ids"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add usage.delivered_tokens (nullable)."""
    with op.batch_alter_table("usage") as batch:
        batch.add_column(sa.Column("delivered_tokens", sa.Integer(), nullable=True))


def downgrade() -> None:
    """Drop usage.delivered_tokens."""
    with op.batch_alter_table("usage") as batch:
        batch.drop_column("delivered_tokens")
