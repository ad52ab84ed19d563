"""Plain dataclasses that cross the billing boundary: tenants, keys, usage rows and summaries."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

# Terminal states of one engine request, as the ledger stores them.
# `interrupted`: the gateway died before writing the row; billed later from the engine's own record.
USAGE_STATUSES: frozenset[str] = frozenset(
    {"completed", "cancelled", "deadline", "rejected", "error", "interrupted"}
)
CANCEL_STATES: frozenset[str] = frozenset({"waiting", "prefill", "decode"})


@dataclass
class Tenant:
    """A tenant: its fair-share weight, priority class (0 = most important), quotas and queue bound."""

    id: str
    name: str
    weight: float
    priority_class: int
    tokens_per_minute: int | None
    tokens_per_day: int | None
    max_queued_requests: int | None
    disabled: bool
    created_at: datetime
    updated_at: datetime
    cache_group: str | None = (
        None  # prefix-cache sharing group (engine/core/kv_cache.py); None: own blocks only
    )
    on_infeasible: str | None = None  # its requests' default X-On-Infeasible; None: the server's


@dataclass
class ApiKeyInfo:
    """An API key as it can be shown: never the secret, only its display prefix."""

    id: str
    tenant_id: str
    prefix: str
    name: str
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None

    @property
    def revoked(self) -> bool:
        """True once the key has been revoked."""
        return self.revoked_at is not None


@dataclass
class UsageRecord:
    """One ended engine request, as the gateway hands it to the ledger."""

    request_id: str
    tenant_id: str
    api_key_id: str | None
    task_id: str | None
    workflow_run_id: str | None
    attempt: int
    model: str
    status: str
    finish_reason: str | None
    cancel_state: str | None
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    charged_service: float
    tokens_after_cancel: int
    preemptions: int
    recomputed_tokens: int
    queue_ms: float | None
    ttft_ms: float | None
    e2e_ms: float | None
    created_at: datetime
    finished_at: datetime
    # Completion tokens handed to the client's connection; None where unknown (an interrupted request,
    # rows from before migration 0005). What is billed is completion_tokens: the tokens produced.
    delivered_tokens: int | None = None
    # Several models (migration 0007): the model that served it (None: rows from before, the `model`), how
    # its deadline degraded it (fallback | partial | truncated; None: served as asked), prompt tokens dropped.
    served_model: str | None = None
    degradation: str | None = None
    dropped_tokens: int = 0
    # An upstream engine that reported no usage (upstream/, migration 0012): the completion tokens are the
    # gateway's own count of what it streamed, not the engine's. False for every engine that counts.
    counted_by_gateway: bool = False


# The counts a usage row may never hold below zero: the ledger refuses such a row before its journal, a
# journal or spill line holding one is quarantined, and the database has a CHECK constraint for each
# (migration 0010; delivered_tokens may also be None).
TOKEN_COUNTS = (
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "tokens_after_cancel",
    "preemptions",
    "recomputed_tokens",
    "dropped_tokens",
    "delivered_tokens",
)


def check_counts(row: UsageRecord) -> None:
    """ValueError naming the first count of `row` below zero, or a charged_service that is not a finite
    number >= 0 (migration 0012 constrains it too)."""
    for name in TOKEN_COUNTS:
        value = getattr(row, name)
        if value is not None and value < 0:
            raise ValueError(f"usage {name} must be >= 0, got {value!r}")
    if not (row.charged_service >= 0 and math.isfinite(row.charged_service)):
        raise ValueError(f"usage charged_service must be a finite number >= 0, got {row.charged_service!r}")


# A journal or spill row written by an older fairserve may lack fields added since; these are the values
# such a row is stored with (billing/spill.py decode_row). A field without an entry here is required.
USAGE_DEFAULTS: dict[str, Any] = {
    "api_key_id": None,
    "task_id": None,
    "workflow_run_id": None,
    "attempt": 0,
    "finish_reason": None,
    "cancel_state": None,
    "cached_tokens": 0,
    "charged_service": 0.0,
    "tokens_after_cancel": 0,
    "preemptions": 0,
    "recomputed_tokens": 0,
    "queue_ms": None,
    "ttft_ms": None,
    "e2e_ms": None,
    "delivered_tokens": None,
    "served_model": None,
    "degradation": None,
    "dropped_tokens": 0,
    "counted_by_gateway": False,
}


@dataclass
class UsageSummary:
    """Usage of one tenant over a time range: requests by status, tokens by kind, charged service."""

    tenant_id: str
    tenant_name: str | None
    requests: int = 0
    requests_by_status: dict[str, int] = field(default_factory=dict)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    charged_service: float = 0.0
    tokens_after_cancel: int = 0
    preemptions: int = 0
    recomputed_tokens: int = 0


@dataclass
class DailyUsage:
    """One row of the daily per-tenant rollup (UTC days), by status."""

    day: str
    tenant_id: str
    status: str
    requests: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    charged_service: float
    tokens_after_cancel: int
    preemptions: int
    recomputed_tokens: int


@dataclass
class AuditEntry:
    """One administrative change: who did what to which tenant, with the state before and after."""

    id: int
    actor: str
    action: str
    tenant_id: str | None
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    at: datetime
