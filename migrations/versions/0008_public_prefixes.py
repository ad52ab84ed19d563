"""public_prefixes: prompt prefixes an operator made shareable across tenants, per model.

Revision ID: 0008_public_prefixes
Revises: 0007_served_model
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008_public_prefixes"
# 0007 is another branch's; whoever merges both chains this one after it.
down_revision = "0007_served_model"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create public_prefixes (model, name unique; token ids as JSON, the text it was registered as)."""
    op.create_table(
        "public_prefixes",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("text", sa.Text(), nullable=True),
        sa.Column("token_ids", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("model", "name", name="uq_public_prefixes_model_name"),
    )


def downgrade() -> None:
    """Drop public_prefixes."""
    op.drop_table("public_prefixes")
