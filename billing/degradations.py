"""Per tenant, how its requests were served: by which model, and how many degraded to meet a deadline.

Read from the usage rows' `served_model`, `degradation` and `dropped_tokens` (migration 0007) for the
admin usage API and the dashboard. A row from before 0007 counts under its `model`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from billing.models import UsageRow


@dataclass
class ServedSummary:
    """One tenant's requests by serving model and by degradation, and the prompt tokens truncation dropped."""

    tenant_id: str
    by_model: dict[str, int] = field(default_factory=dict)
    degraded: dict[str, int] = field(default_factory=dict)  # fallback | partial | truncated -> requests
    dropped_tokens: int = 0


def served_by_tenant(session: Session, since: datetime, until: datetime | None = None) -> list[ServedSummary]:
    """Per tenant, over rows finished in [since, until): requests per serving model and per degradation."""
    window = [UsageRow.finished_at >= since]
    if until is not None:
        window.append(UsageRow.finished_at < until)
    model = func.coalesce(UsageRow.served_model, UsageRow.model)
    query = (
        select(
            UsageRow.tenant_id, model, UsageRow.degradation, func.count(), func.sum(UsageRow.dropped_tokens)
        )
        .where(*window)
        .group_by(UsageRow.tenant_id, model, UsageRow.degradation)
    )
    out: dict[str, ServedSummary] = {}
    for tid, served, degradation, count, dropped in session.execute(query):
        s = out.setdefault(tid, ServedSummary(tid))
        s.by_model[served] = s.by_model.get(served, 0) + int(count)
        if degradation is not None:
            s.degraded[degradation] = s.degraded.get(degradation, 0) + int(count)
        s.dropped_tokens += int(dropped or 0)
    return sorted(out.values(), key=lambda s: s.tenant_id)
