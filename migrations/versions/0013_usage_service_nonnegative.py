"""CHECK constraint: a usage row's charged_service is >= 0.

Service is what a tenant was charged; below zero it would credit the tenant (issue 54: SQL accepted −100).
The ledger refuses such a row before its journal (billing/records.py `check_counts`), and the database now
refuses it too. Rows already stored with a negative charge stop the upgrade with a message naming how many:
the ledger never rewrites a billed row on its own.

Revision ID: 0013_usage_service_nonnegative
Revises: 0012_counted_by_gateway
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013_usage_service_nonnegative"
down_revision = "0012_counted_by_gateway"
branch_labels = None
depends_on = None

NAME = "ck_usage_charged_service_nonnegative"
CHECK = "charged_service >= 0"


def upgrade() -> None:
    """Add the constraint, after making sure no stored row breaks it."""
    count = op.get_bind().execute(sa.text(f"SELECT count(*) FROM usage WHERE NOT ({CHECK})")).scalar_one()
    if count:
        raise RuntimeError(
            f"{count} usage rows hold a negative charged_service; find them with "
            f"SELECT * FROM usage WHERE NOT ({CHECK}), correct them, and upgrade again"
        )
    if op.get_bind().dialect.name == "sqlite":  # SQLite adds a constraint only by rebuilding the table
        with op.batch_alter_table("usage", recreate="always") as batch:
            batch.create_check_constraint(NAME, CHECK)
        return
    op.create_check_constraint(NAME, "usage", CHECK)


def downgrade() -> None:
    """Drop the constraint."""
    if op.get_bind().dialect.name == "sqlite":
        with op.batch_alter_table("usage", recreate="always") as batch:
            batch.drop_constraint(NAME, type_="check")
    else:
        op.drop_constraint(NAME, "usage", type_="check")
