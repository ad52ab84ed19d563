"""Usage rows keyed on (tenant_id, request_id): request ids are scoped to the tenant that sent them.

A request id is chosen by the caller (`X-Request-Id`); with `request_id` alone as the key, one tenant's
id blocked (and revealed) another tenant's use of the same string.

Revision ID: 0003_tenant_request_ids
Revises: 0002_cache_group
Create Date: 2026-11-30
"""

from __future__ import annotations

import warnings

from alembic import op
from sqlalchemy.exc import SAWarning

revision = "0003_tenant_request_ids"
down_revision = "0002_cache_group"
branch_labels = None
depends_on = None


def _set_primary_key(columns: list[str]) -> None:
    # SQLite cannot alter a primary key in place: batch mode rebuilds the table, and a new primary key
    # replaces the old one there. PostgreSQL alters it in place; its constraint has the default name.
    if op.get_bind().dialect.name == "sqlite":
        # The copied columns keep their old primary_key flags, which SQLAlchemy warns about before it lets the
        # named constraint win, as intended here.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=SAWarning, message=".*_alembic_tmp_usage.*primary_key")
            with op.batch_alter_table("usage", recreate="always") as batch:
                batch.create_primary_key("usage_pkey", columns)
        return
    op.drop_constraint("usage_pkey", "usage", type_="primary")
    op.create_primary_key("usage_pkey", "usage", columns)


def upgrade() -> None:
    """Primary key (tenant_id, request_id)."""
    _set_primary_key(["tenant_id", "request_id"])


def downgrade() -> None:
    """Primary key request_id alone (fails if two tenants now share an id, as it must)."""
    _set_primary_key(["request_id"])
