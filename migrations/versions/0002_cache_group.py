"""Tenants get a nullable cache_group: tenants in the same group share prefix-cache blocks.

Revision ID: 0002_cache_group
Revises: 0001_initial
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_cache_group"
down_revision = "0001_initial"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add tenants.cache_group (NULL: the tenant shares its cached prefixes with nobody)."""
    with op.batch_alter_table("tenants") as batch:
        batch.add_column(sa.Column("cache_group", sa.String(64), nullable=True))


def downgrade() -> None:
    """Drop tenants.cache_group."""
    with op.batch_alter_table("tenants") as batch:
        batch.drop_column("cache_group")
