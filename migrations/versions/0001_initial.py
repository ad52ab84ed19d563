"""Initial schema: tenants, api_keys, usage, usage_daily rollups, audit_log.

Revision ID: 0001_initial
Revises:
Create Date: 2026-05-09
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001_initial"
down_revision = None
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    """Create every table of the first release."""
    op.create_table(
        "tenants",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("weight", sa.Float, nullable=False),
        sa.Column("priority_class", sa.Integer, nullable=False),
        sa.Column("tokens_per_minute", sa.BigInteger, nullable=True),
        sa.Column("tokens_per_day", sa.BigInteger, nullable=True),
        sa.Column("max_queued_requests", sa.Integer, nullable=True),
        sa.Column("disabled", sa.Boolean, nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.UniqueConstraint("name", name="uq_tenants_name"),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column(
            "tenant_id",
            sa.String(36),
            sa.ForeignKey("tenants.id", ondelete="CASCADE", name="fk_api_keys_tenant"),
            nullable=False,
        ),
        sa.Column("prefix", sa.String(16), nullable=False),
        sa.Column("key_hash", sa.String(64), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("last_used_at", TS, nullable=True),
        sa.Column("revoked_at", TS, nullable=True),
        sa.UniqueConstraint("key_hash", name="uq_api_keys_key_hash"),
    )
    op.create_index("ix_api_keys_tenant_id", "api_keys", ["tenant_id"])
    op.create_table(
        "usage",
        sa.Column("request_id", sa.String(128), primary_key=True),
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("api_key_id", sa.String(36), nullable=True),
        sa.Column("task_id", sa.String(128), nullable=True),
        sa.Column("workflow_run_id", sa.String(128), nullable=True),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("finish_reason", sa.String(16), nullable=True),
        sa.Column("cancel_state", sa.String(16), nullable=True),
        sa.Column("prompt_tokens", sa.Integer, nullable=False),
        sa.Column("cached_tokens", sa.Integer, nullable=False),
        sa.Column("completion_tokens", sa.Integer, nullable=False),
        sa.Column("charged_service", sa.Float, nullable=False),
        sa.Column("tokens_after_cancel", sa.Integer, nullable=False),
        sa.Column("preemptions", sa.Integer, nullable=False),
        sa.Column("recomputed_tokens", sa.Integer, nullable=False),
        sa.Column("queue_ms", sa.Float, nullable=True),
        sa.Column("ttft_ms", sa.Float, nullable=True),
        sa.Column("e2e_ms", sa.Float, nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("finished_at", TS, nullable=False),
    )
    op.create_index("ix_usage_tenant_finished", "usage", ["tenant_id", "finished_at"])
    op.create_index("ix_usage_task", "usage", ["task_id"])
    op.create_table(
        "usage_daily",
        sa.Column("day", sa.Date, primary_key=True),
        sa.Column("tenant_id", sa.String(128), primary_key=True),
        sa.Column("status", sa.String(16), primary_key=True),
        sa.Column("requests", sa.BigInteger, nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger, nullable=False),
        sa.Column("cached_tokens", sa.BigInteger, nullable=False),
        sa.Column("completion_tokens", sa.BigInteger, nullable=False),
        sa.Column("charged_service", sa.Float, nullable=False),
        sa.Column("tokens_after_cancel", sa.BigInteger, nullable=False),
        sa.Column("preemptions", sa.BigInteger, nullable=False),
        sa.Column("recomputed_tokens", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "audit_log",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("tenant_id", sa.String(36), nullable=True),
        sa.Column("before", sa.JSON, nullable=True),
        sa.Column("after", sa.JSON, nullable=True),
        sa.Column("at", TS, nullable=False),
    )
    op.create_index("ix_audit_log_at", "audit_log", ["at"])
    op.create_index("ix_audit_log_tenant_id", "audit_log", ["tenant_id"])


def downgrade() -> None:
    """Drop every table of the first release."""
    op.drop_index("ix_audit_log_tenant_id", table_name="audit_log")
    op.drop_index("ix_audit_log_at", table_name="audit_log")
    op.drop_table("audit_log")
    op.drop_table("usage_daily")
    op.drop_index("ix_usage_task", table_name="usage")
    op.drop_index("ix_usage_tenant_finished", table_name="usage")
    op.drop_table("usage")
    op.drop_index("ix_api_keys_tenant_id", table_name="api_keys")
    op.drop_table("api_keys")
    op.drop_table("tenants")
