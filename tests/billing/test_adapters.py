"""AdapterStore on SQLite and PostgreSQL: names are unique, changes are audited with their actor, a tenant's
adapters go with the tenant's row, and the cap holds."""

from __future__ import annotations

import pytest
from sqlalchemy import delete
from sqlalchemy.orm import Session

from billing import BillingStore, Database
from billing.adapters import AdapterExists, AdapterNotFound, AdapterStore, TooManyAdapters
from billing.models import TenantRow


def test_add_list_remove_are_audited(any_db: Database, store: BillingStore) -> None:
    adapters = AdapterStore(any_db)
    tenant = store.create_tenant("acme")
    public = adapters.add("shared", "/srv/lora/shared", None, actor="admin:ops")
    private = adapters.add("acme-tuned", "/srv/lora/acme", tenant.id, actor="admin")
    assert public.tenant_id is None and private.tenant_id == tenant.id
    assert [a.name for a in adapters.list()] == ["shared", "acme-tuned"]
    with pytest.raises(AdapterExists):
        adapters.add("shared", "/elsewhere", tenant.id)
    assert adapters.remove("acme-tuned", actor="admin:ops").path == "/srv/lora/acme"
    with pytest.raises(AdapterNotFound):
        adapters.remove("acme-tuned")
    audit = [(e.action, e.actor, e.tenant_id) for e in store.list_audit() if e.action.startswith("adapter.")]
    assert audit[::-1] == [
        ("adapter.add", "admin:ops", None),
        ("adapter.add", "admin", tenant.id),
        ("adapter.remove", "admin:ops", tenant.id),
    ]


def test_a_tenants_adapters_go_with_its_row(any_db: Database, store: BillingStore) -> None:
    adapters = AdapterStore(any_db)
    tenant = store.create_tenant("gone")
    adapters.add("gone-tuned", "/srv/lora/gone", tenant.id)
    adapters.add("kept", "/srv/lora/kept", None)
    with Session(any_db.engine) as session, session.begin():  # no API deletes a tenant: the row directly
        session.execute(delete(TenantRow).where(TenantRow.id == tenant.id))
    assert [a.name for a in adapters.list()] == ["kept"]


def test_the_directory_is_capped(sqlite_db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("billing.adapters.MAX_ADAPTERS", 2)
    adapters = AdapterStore(sqlite_db)
    adapters.add("one", "/a", None)
    adapters.add("two", "/b", None)
    with pytest.raises(TooManyAdapters):
        adapters.add("three", "/c", None)
