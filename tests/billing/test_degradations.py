"""The served model, the degradation and the dropped tokens go through the ledger to SQL and back, on both
dialects (migration 0007), and `served_share` sums them per tenant; a tenant's default policy is stored."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import text

from billing import BillingStore, Database, Ledger, LedgerConfig
from tests.billing.test_ledger import BASE, make_row


def test_served_model_degradation_and_dropped_tokens_are_stored_and_summed(
    any_db: Database, tmp_path: Path
) -> None:
    ledger = Ledger(any_db, LedgerConfig(spill_path=str(tmp_path / "s")), registry=CollectorRegistry())
    ledger.start()
    ledger.record(replace(make_row(0), served_model="small", degradation="fallback"))
    ledger.record(replace(make_row(3), served_model="tiny", degradation="truncated", dropped_tokens=700))
    ledger.record(replace(make_row(6), served_model="tiny", degradation="partial"))
    ledger.record(make_row(9))  # a row as before 0007: served_model NULL, counted under its `model`
    assert ledger.flush(timeout_s=30)
    ledger.close()
    with any_db.engine.connect() as conn:
        row = conn.execute(
            text("SELECT served_model, degradation, dropped_tokens FROM usage WHERE request_id = 'req-3'")
        ).one()
    assert tuple(row) == ("tiny", "truncated", 700)
    served = {s.tenant_id: s for s in BillingStore(any_db).served_share(BASE - timedelta(days=1))}
    t0 = served["t0"]  # rows 0, 3, 6 and 9 all belong to tenant t0 (i % 3 == 0)
    assert t0.by_model == {"small": 1, "tiny": 3}
    assert t0.degraded == {"fallback": 1, "truncated": 1, "partial": 1}
    assert t0.dropped_tokens == 700


def test_a_tenants_default_policy_is_stored_and_validated(any_db: Database) -> None:
    store = BillingStore(any_db)
    tenant = store.create_tenant("acme", on_infeasible="partial")
    found = store.get_tenant("acme")
    assert found is not None and found.on_infeasible == "partial"
    assert store.update_tenant(tenant.id, on_infeasible=None).on_infeasible is None
    with pytest.raises(ValueError, match="on_infeasible"):
        store.update_tenant(tenant.id, on_infeasible="pray")
