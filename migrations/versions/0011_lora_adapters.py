"""lora_adapters: LoRA adapters registered at run time through the admin API, public or one tenant's.

Revision ID: 0011_lora_adapters
Revises: 0010_gateways_nonnegative_tokens
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011_lora_adapters"
# Another branch may add its own 0011; whoever merges both chains this one after it.
down_revision = "0010_gateways_nonnegative_tokens"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create lora_adapters (name the key; tenant_id NULL for a public adapter, else its owner)."""
    op.create_table(
        "lora_adapters",
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("path", sa.String(4096), nullable=False),
        sa.Column(
            "tenant_id",
            sa.String(36),
            sa.ForeignKey("tenants.id", ondelete="CASCADE", name="fk_lora_adapters_tenant"),
            nullable=True,
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(128), nullable=False),
    )
    op.create_index("ix_lora_adapters_tenant_id", "lora_adapters", ["tenant_id"])


def downgrade() -> None:
    """Drop lora_adapters."""
    op.drop_index("ix_lora_adapters_tenant_id", table_name="lora_adapters")
    op.drop_table("lora_adapters")
