"""gateways (the deployment's gateway identities) and CHECK constraints: usage token counts are >= 0.

A gateway bills an engine's records of a dead peer only when the peer is a registered gateway
(gateway/ops/produced.py); token counts below zero are refused by the database as by the journal.
Rows already stored with a negative count stop the upgrade with a message naming how many: the ledger
never rewrites a billed row on its own.

Revision ID: 0010_gateways_nonnegative_tokens
Revises: 0009_usage_scopes
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010_gateways_nonnegative_tokens"
down_revision = "0009_usage_scopes"
branch_labels = None
depends_on = None

NONNEGATIVE = (
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "tokens_after_cancel",
    "preemptions",
    "recomputed_tokens",
    "dropped_tokens",
)
_CHECKS = {f"ck_usage_{name}_nonnegative": f"{name} >= 0" for name in NONNEGATIVE}
_CHECKS["ck_usage_delivered_tokens_nonnegative"] = "delivered_tokens IS NULL OR delivered_tokens >= 0"


def upgrade() -> None:
    """Create gateways; add the CHECK constraints (after making sure no stored row breaks them)."""
    broken = " OR ".join(f"NOT ({check})" for check in _CHECKS.values())
    count = op.get_bind().execute(sa.text(f"SELECT count(*) FROM usage WHERE {broken}")).scalar_one()
    if count:
        raise RuntimeError(
            f"{count} usage rows hold a negative token count; find them with "
            f"SELECT * FROM usage WHERE {broken}, correct them, and upgrade again"
        )
    op.create_table(
        "gateways",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("registered_at", sa.DateTime(timezone=True), nullable=False),
    )
    if op.get_bind().dialect.name == "sqlite":  # SQLite adds a constraint only by rebuilding the table
        with op.batch_alter_table("usage", recreate="always") as batch:
            for name, check in _CHECKS.items():
                batch.create_check_constraint(name, check)
        return
    for name, check in _CHECKS.items():
        op.create_check_constraint(name, "usage", check)


def downgrade() -> None:
    """Drop the constraints and gateways."""
    if op.get_bind().dialect.name == "sqlite":
        with op.batch_alter_table("usage", recreate="always") as batch:
            for name in _CHECKS:
                batch.drop_constraint(name, type_="check")
    else:
        for name in _CHECKS:
            op.drop_constraint(name, "usage", type_="check")
    op.drop_table("gateways")
