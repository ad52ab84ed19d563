"""Reconciliation of the ledger with the engines' own per-tenant counters of produced tokens.

Both sides count requests that finished from the start of `since`'s UTC hour on (the engines keep hourly
totals, engine/serving/remote/accounting.py). Every tenant and count where they differ is a difference: a row the
ledger lacks (or holds twice over what was produced), or tokens billed that no engine produced.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import func, select

from billing.db import Database
from billing.models import UsageRow

COUNTS = ("requests", "prompt_tokens", "cached_tokens", "completion_tokens")
Totals = dict[str, dict[str, int]]  # tenant id -> count name -> value


@dataclass(frozen=True)
class Difference:
    """One count of one tenant on which the ledger and the engines disagree."""

    tenant_id: str
    count: str
    ledger: int
    engines: int

    @property
    def delta(self) -> int:
        """Ledger minus engines: > 0 billed beyond what was produced, < 0 produced and not billed."""
        return self.ledger - self.engines


def hour_start(since: datetime) -> datetime:
    """The start of `since`'s UTC hour: the engines' counters' resolution."""
    since = since.astimezone(UTC) if since.tzinfo else since.replace(tzinfo=UTC)
    return since.replace(minute=0, second=0, microsecond=0)


def ledger_totals(db: Database, since: datetime) -> Totals:
    """Per-tenant counts of the ledger's rows that finished from `hour_start(since)` on."""
    u = UsageRow
    query = (
        select(
            u.tenant_id,
            func.count(),
            func.coalesce(func.sum(u.prompt_tokens), 0),
            func.coalesce(func.sum(u.cached_tokens), 0),
            func.coalesce(func.sum(u.completion_tokens), 0),
        )
        .where(u.finished_at >= hour_start(since))
        .group_by(u.tenant_id)
    )
    with db.engine.connect() as conn:
        return {row[0]: dict(zip(COUNTS, map(int, row[1:]), strict=True)) for row in conn.execute(query)}


def differences(ledger: Totals, engines: Totals) -> list[Difference]:
    """Every (tenant, count) where the two sides disagree, tenants in order."""
    found: list[Difference] = []
    for tenant in sorted(ledger.keys() | engines.keys()):
        mine, theirs = ledger.get(tenant, {}), engines.get(tenant, {})
        for count in COUNTS:
            a, b = mine.get(count, 0), theirs.get(count, 0)
            if a != b:
                found.append(Difference(tenant, count, a, b))
    return found
