"""usage.counted_by_gateway: the row's completion tokens are the gateway's count, not the engine's.

An upstream engine (`fairserve serve --upstream`, upstream/) that sends no usage is billed by what the
gateway counted of its stream (never 0); the row says so, so an operator can tell the two apart.

Revision ID: 0012_counted_by_gateway
Revises: 0011_lora_adapters
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012_counted_by_gateway"
# Another branch may add its own 0012; whoever merges both chains this one after it.
down_revision = "0011_lora_adapters"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add usage.counted_by_gateway, false for every row so far (their engines counted)."""
    with op.batch_alter_table("usage") as batch:
        batch.add_column(
            sa.Column("counted_by_gateway", sa.Boolean(), nullable=False, server_default=sa.false())
        )


def downgrade() -> None:
    """Drop usage.counted_by_gateway."""
    with op.batch_alter_table("usage") as batch:
        batch.drop_column("counted_by_gateway")
