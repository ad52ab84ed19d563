"""Task-level telemetry from the ledger: what a task (X-Task-Id) or workflow run cost, and how much was wasted.

A task is one logical call that a client may retry or hedge (fairserve_client numbers the attempts with
X-Attempt). From the usage rows of one tenant's task or run:

- attempts: distinct attempt numbers; requests completed, cancelled, ended by their deadline, and rejected
  for an infeasible deadline (the edge writes a row for those when they carry a task or run id);
- tokens computed after a cancel (`tokens_after_cancel`, as the engine counted them);
- wasted tokens, in engine tokens (prompt computed + output, `prompt - cached + completion`): those of
  cancelled requests (branches a client abandoned), and those of completed attempts whose answer a retry
  replaced: every completed row with an attempt number below the task's highest completed attempt.

A report reads one row: the ledger's rollup of the task (usage_scope_totals, kept by billing/scope_rollup.py
as rows are stored), so a task of 50,000 requests or 50,000 distinct attempts costs what one of five does;
the per-tenant report budget (gateway/openai/tasks.py) bounds how often it is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Select, and_, func, select
from sqlalchemy.orm import Session

from billing.models import UsageRow, UsageScopeTotalRow

# The finish_reason of a ledger row the edge writes for a request refused for an infeasible deadline.
INFEASIBLE = "infeasible"
# The rollup's counts, summed as rows come (billing/scope_rollup.py keeps them; `attempts` is added to only for
# attempts new to the ledger), and the columns a report reads: those and the kept attempt's tokens.
SUMMED = (
    "attempts",
    "requests",
    "completed",
    "cancelled",
    "deadline",
    "rejected_infeasible",
    "engine_tokens",
    "tokens_after_cancel",
    "cancelled_tokens",
    "completed_tokens",
)
_REPORTED = (*SUMMED, "kept_tokens")


@dataclass
class TaskReport:
    """One task's or workflow run's attempts, outcomes and wasted tokens (engine tokens)."""

    attempts: int = 0
    requests: int = 0
    completed: int = 0
    cancelled: int = 0
    deadline: int = 0
    rejected_infeasible: int = 0
    engine_tokens: int = 0
    tokens_after_cancel: int = 0
    cancelled_tokens: int = 0
    replaced_tokens: int = 0

    @property
    def wasted_tokens(self) -> int:
        """Cancelled branches plus replaced attempts."""
        return self.cancelled_tokens + self.replaced_tokens


@dataclass
class WastedShare:
    """One tenant's wasted engine tokens over a time range, and their share of its engine tokens."""

    tenant_id: str
    engine_tokens: int = 0
    cancelled_tokens: int = 0
    replaced_tokens: int = 0
    tokens_after_cancel: int = 0

    @property
    def wasted_share(self) -> float:
        """(cancelled + replaced) / all engine tokens; 0 with no tokens."""
        wasted = self.cancelled_tokens + self.replaced_tokens
        return wasted / self.engine_tokens if self.engine_tokens else 0.0


def _engine_tokens() -> ColumnElement[Any]:
    return UsageRow.prompt_tokens - UsageRow.cached_tokens + UsageRow.completion_tokens


def report_query(tenant_id: str, kind: str, scope_id: str) -> Select[Any]:
    """The rollup row of one tenant's task (kind "task") or workflow run ("run"): one key of
    usage_scope_totals, whose primary key begins with the tenant, so another tenant's id reads what an
    unknown one does (nothing)."""
    columns = [UsageScopeTotalRow.__table__.c[name] for name in _REPORTED]
    return select(*columns).where(
        UsageScopeTotalRow.tenant_id == tenant_id,
        UsageScopeTotalRow.kind == kind,
        UsageScopeTotalRow.scope_id == scope_id,
    )


def task_report(
    session: Session, tenant_id: str, task_id: str | None = None, workflow_run_id: str | None = None
) -> TaskReport | None:
    """The report of `tenant_id`'s task (or workflow run); None when the ledger has no row of it.

    One row of the rollup the ledger keeps (usage_scope_totals, billing/scope_rollup.py), so its cost is
    the same whatever the task holds: attempts, users, requests."""
    kind, scope_id = ("task", task_id) if task_id is not None else ("run", workflow_run_id)
    assert scope_id is not None
    found = session.execute(report_query(tenant_id, kind, scope_id)).one_or_none()
    if found is None or not found.requests:
        return None
    values = dict(zip(_REPORTED, found, strict=True))
    completed_tokens, kept_tokens = values.pop("completed_tokens"), values.pop("kept_tokens")
    # Every completed attempt below the highest one was replaced by a retry.
    return TaskReport(**values, replaced_tokens=completed_tokens - kept_tokens)


def wasted_by_tenant(session: Session, since: datetime, until: datetime | None = None) -> list[WastedShare]:
    """Per tenant, over rows finished in [since, until): engine tokens, and those cancelled or replaced."""
    window = [UsageRow.finished_at >= since]
    if until is not None:
        window.append(UsageRow.finished_at < until)
    tokens = _engine_tokens()
    shares: dict[str, WastedShare] = {}
    totals = select(
        UsageRow.tenant_id,
        func.sum(tokens),
        func.sum(tokens).filter(UsageRow.status == "cancelled"),
        func.sum(UsageRow.tokens_after_cancel),
    ).where(*window)
    for tid, engine_tokens, cancelled, after in session.execute(totals.group_by(UsageRow.tenant_id)):
        shares[tid] = WastedShare(tid, int(engine_tokens or 0), int(cancelled or 0), 0, int(after or 0))
    kept = (
        select(UsageRow.tenant_id, UsageRow.task_id, func.max(UsageRow.attempt).label("kept"))
        .where(*window, UsageRow.task_id.is_not(None), UsageRow.status == "completed")
        .group_by(UsageRow.tenant_id, UsageRow.task_id)
        .subquery()
    )
    replaced = (
        select(UsageRow.tenant_id, func.sum(tokens))
        .join(kept, and_(UsageRow.tenant_id == kept.c.tenant_id, UsageRow.task_id == kept.c.task_id))
        .where(*window, UsageRow.status == "completed", UsageRow.attempt < kept.c.kept)
        .group_by(UsageRow.tenant_id)
    )
    for tid, value in session.execute(replaced):
        if tid in shares:
            shares[tid].replaced_tokens = int(value or 0)
    return sorted(shares.values(), key=lambda s: s.tenant_id)
