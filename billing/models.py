"""SQLAlchemy 2 models: tenants, api_keys, usage (one row per request), the usage_daily and task rollups
(usage_scope_totals, usage_scope_attempts), audit_log, public_prefixes, lora_adapters."""

from __future__ import annotations

from datetime import UTC, date, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    Date,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from billing import fields as width
from billing.records import TOKEN_COUNTS


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every dialect (SQLite stores naive text, so re-attach UTC on read)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        value = value.astimezone(UTC)
        # SQLite compares datetimes as text, so store one canonical naive-UTC form there.
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def utcnow() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(UTC)


class Base(DeclarativeBase):
    """Declarative base; its metadata is what the Alembic environment compares against."""


class TenantRow(Base):
    """A tenant and its contract with the scheduler and the edge."""

    __tablename__ = "tenants"
    __table_args__ = (UniqueConstraint("name", name="uq_tenants_name"),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    name: Mapped[str] = mapped_column(String(128), nullable=False)
    weight: Mapped[float] = mapped_column(Float, nullable=False, default=1.0)
    priority_class: Mapped[int] = mapped_column(Integer, nullable=False, default=1)
    tokens_per_minute: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    tokens_per_day: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    max_queued_requests: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # Tenants with the same cache group share prefix-cache blocks; None: the tenant shares with nobody.
    cache_group: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # Its requests' default X-On-Infeasible (reject | fallback | partial | truncate); None: the server's.
    on_infeasible: Mapped[str | None] = mapped_column(String(16), nullable=True)
    disabled: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)


class ApiKeyRow(Base):
    """An API key, stored only as the sha256 of its secret plus a short display prefix."""

    __tablename__ = "api_keys"
    __table_args__ = (UniqueConstraint("key_hash", name="uq_api_keys_key_hash"),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(
        String(36), ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False, index=True
    )
    prefix: Mapped[str] = mapped_column(String(16), nullable=False)
    key_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    name: Mapped[str] = mapped_column(String(128), nullable=False, default="default")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


# The usage counts a CHECK constraint keeps at zero or above (delivered_tokens, nullable, has its own).
NONNEGATIVE = tuple(name for name in TOKEN_COUNTS if name != "delivered_tokens")


class UsageRow(Base):
    """One ended engine request. No foreign key to tenants: the ledger is an append-only fact table."""

    __tablename__ = "usage"
    __table_args__ = (
        Index("ix_usage_tenant_finished", "tenant_id", "finished_at"),
        # Tenant first (migration 0009): a lookup of another tenant's task id ends where an unknown id does.
        Index("ix_usage_tenant_task", "tenant_id", "task_id"),
        Index("ix_usage_workflow_run", "tenant_id", "workflow_run_id"),
        # Token counts are never negative (migration 0010), whatever a journal line or a caller says.
        *(CheckConstraint(f"{name} >= 0", name=f"ck_usage_{name}_nonnegative") for name in NONNEGATIVE),
        CheckConstraint(
            "delivered_tokens IS NULL OR delivered_tokens >= 0", name="ck_usage_delivered_tokens_nonnegative"
        ),
        # Nor is the service charged (migration 0012): below zero it would credit the tenant.
        CheckConstraint("charged_service >= 0", name="ck_usage_charged_service_nonnegative"),
    )

    # Request ids are the caller's choice, so they are unique only within a tenant (migration 0002).
    tenant_id: Mapped[str] = mapped_column(String(width.TENANT_ID_MAX), primary_key=True)
    request_id: Mapped[str] = mapped_column(String(width.REQUEST_ID_MAX), primary_key=True)
    api_key_id: Mapped[str | None] = mapped_column(String(width.UUID_MAX), nullable=True)
    task_id: Mapped[str | None] = mapped_column(String(width.TASK_ID_MAX), nullable=True)
    workflow_run_id: Mapped[str | None] = mapped_column(String(width.WORKFLOW_RUN_ID_MAX), nullable=True)
    attempt: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    model: Mapped[str] = mapped_column(String(width.MODEL_MAX), nullable=False)
    status: Mapped[str] = mapped_column(String(width.STATUS_MAX), nullable=False)
    finish_reason: Mapped[str | None] = mapped_column(String(width.FINISH_REASON_MAX), nullable=True)
    cancel_state: Mapped[str | None] = mapped_column(String(width.CANCEL_STATE_MAX), nullable=True)
    prompt_tokens: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    cached_tokens: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    charged_service: Mapped[float] = mapped_column(Float, nullable=False, default=0.0)
    tokens_after_cancel: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    preemptions: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    recomputed_tokens: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    queue_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    ttft_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    e2e_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    finished_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    # Tokens produced are billed (completion_tokens); tokens delivered are kept alongside (migration 0005).
    delivered_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # Several models and degraded deadlines (migration 0007).
    served_model: Mapped[str | None] = mapped_column(String(width.MODEL_MAX), nullable=True)
    degradation: Mapped[str | None] = mapped_column(String(width.DEGRADATION_MAX), nullable=True)
    dropped_tokens: Mapped[int] = mapped_column(Integer, nullable=False, default=0, server_default="0")
    # The completion tokens are the gateway's count: an upstream engine sent no usage (migration 0012).
    counted_by_gateway: Mapped[bool] = mapped_column(
        Boolean, nullable=False, default=False, server_default=false()
    )


class UsageDailyRow(Base):
    """Daily per-tenant rollup by status, maintained by the ledger in the same transaction as the rows."""

    __tablename__ = "usage_daily"

    day: Mapped[date] = mapped_column(Date, primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(width.TENANT_ID_MAX), primary_key=True)
    status: Mapped[str] = mapped_column(String(width.STATUS_MAX), primary_key=True)
    requests: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    cached_tokens: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    completion_tokens: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    charged_service: Mapped[float] = mapped_column(Float, nullable=False, default=0.0)
    tokens_after_cancel: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    preemptions: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    recomputed_tokens: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)


class UsageScopeTotalRow(Base):
    """One row per tenant, task or workflow run: the whole report, maintained by the ledger in the same
    transaction as the rows it inserts (migration 0014). A report reads this one row, so its cost is the
    same whatever the task holds: 50,000 distinct attempts cost what one does (issue 54).

    `kind` is "task" (X-Task-Id) or "run" (X-Workflow-Run-Id). `kept_attempt` is the highest attempt with a
    completed row (NULL: none yet) and `kept_tokens` the engine tokens of its completed rows, so the tokens
    of answers a retry replaced are `completed_tokens - kept_tokens` (billing/tasks.py).
    """

    __tablename__ = "usage_scope_totals"

    tenant_id: Mapped[str] = mapped_column(String(width.TENANT_ID_MAX), primary_key=True)
    kind: Mapped[str] = mapped_column(String(8), primary_key=True)
    scope_id: Mapped[str] = mapped_column(
        String(max(width.TASK_ID_MAX, width.WORKFLOW_RUN_ID_MAX)), primary_key=True
    )
    attempts: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    requests: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    completed: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    cancelled: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    deadline: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    rejected_infeasible: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    engine_tokens: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    tokens_after_cancel: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    cancelled_tokens: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    completed_tokens: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    kept_attempt: Mapped[int | None] = mapped_column(Integer, nullable=True)
    kept_tokens: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)


class UsageScopeAttemptRow(Base):
    """The attempt numbers seen per tenant, task or run: written only to count distinct attempts as rows
    arrive (an insert that conflicts is an attempt already counted), never read by a report."""

    __tablename__ = "usage_scope_attempts"

    tenant_id: Mapped[str] = mapped_column(String(width.TENANT_ID_MAX), primary_key=True)
    kind: Mapped[str] = mapped_column(String(8), primary_key=True)
    scope_id: Mapped[str] = mapped_column(
        String(max(width.TASK_ID_MAX, width.WORKFLOW_RUN_ID_MAX)), primary_key=True
    )
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)


class GatewayRow(Base):
    """A gateway process of this deployment, by the identity it gives its engines (migration 0010).

    A gateway bills an engine's records of a dead peer's requests only when the peer is registered here:
    every gateway sharing this ledger registers as it starts, so a raw ZeroMQ peer of an engine without a
    cluster key, which is in no table, never has its work billed to a tenant (gateway/ops/produced.py).
    """

    __tablename__ = "gateways"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    registered_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)


class AuditRow(Base):
    """One administrative change with the tenant state before and after, for the admin dashboard."""

    __tablename__ = "audit_log"
    __table_args__ = (Index("ix_audit_log_at", "at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    actor: Mapped[str] = mapped_column(String(128), nullable=False)
    action: Mapped[str] = mapped_column(String(64), nullable=False)
    tenant_id: Mapped[str | None] = mapped_column(String(36), nullable=True, index=True)
    before: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    after: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)


class PublicPrefixRow(Base):
    """A prompt prefix an operator made public for one model: its blocks are shared by every tenant
    (gateway/public_prefixes.py). Token ids are stored, so every gateway matches the same prefix."""

    __tablename__ = "public_prefixes"
    __table_args__ = (UniqueConstraint("model", "name", name="uq_public_prefixes_model_name"),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    model: Mapped[str] = mapped_column(String(width.MODEL_MAX), nullable=False)
    name: Mapped[str] = mapped_column(String(128), nullable=False)
    text: Mapped[str | None] = mapped_column(Text, nullable=True)
    token_ids: Mapped[list[int]] = mapped_column(JSON, nullable=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)


class LoraAdapterRow(Base):
    """A LoRA adapter an operator registered at run time (gateway/adapters.py): `model: NAME` selects it.
    The path travels to the engines in each request's meta, so every gateway must read the same directory;
    a tenant id makes it private to that tenant (None: public). Removing a tenant removes its adapters."""

    __tablename__ = "lora_adapters"

    name: Mapped[str] = mapped_column(String(width.MODEL_MAX), primary_key=True)
    path: Mapped[str] = mapped_column(String(4096), nullable=False)
    tenant_id: Mapped[str | None] = mapped_column(
        String(36), ForeignKey("tenants.id", ondelete="CASCADE"), nullable=True, index=True
    )
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    actor: Mapped[str] = mapped_column(String(128), nullable=False)
