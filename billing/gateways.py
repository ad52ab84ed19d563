"""The deployment's gateways, by the identity each gives its engines: who may have its work billed.

An attached engine keeps a record of every finished request until the gateway that submitted it confirms
the row; records of a peer that is gone are billed `interrupted` by another gateway (gateway/ops/produced.py).
On an engine without a cluster key any process can be that peer and submit work as any tenant, so a
gateway bills a gone peer's records only when the peer registered here, in the ledger's database, which
every gateway of a deployment shares: each registers its identities as it starts (they are random, 128
bits, and never shown to tenants).
"""

from __future__ import annotations

from collections.abc import Collection

from sqlalchemy import select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from billing.db import Database
from billing.models import GatewayRow, utcnow


def register_gateways(db: Database, ids: Collection[str]) -> None:
    """Record these gateway identities as this deployment's (idempotent)."""
    if not ids:
        return
    insert = postgresql.insert if db.engine.dialect.name == "postgresql" else sqlite.insert
    now = utcnow()
    statement = insert(GatewayRow).on_conflict_do_nothing(index_elements=["id"])
    with db.engine.begin() as conn:
        conn.execute(statement, [{"id": i, "registered_at": now} for i in sorted(ids)])


def registered_gateways(db: Database, ids: Collection[str]) -> set[str]:
    """Which of `ids` are gateways of this deployment."""
    if not ids:
        return set()
    with Session(db.engine) as session:
        return set(session.scalars(select(GatewayRow.id).where(GatewayRow.id.in_(sorted(ids)))))
