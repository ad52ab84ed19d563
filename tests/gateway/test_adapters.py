"""AdapterRegistry: a tenant resolves and lists public adapters and its own only; `--lora` entries are
public and keep their name; a change made through another registry (another gateway) shows after reload."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from billing import BillingStore, Database
from gateway.adapters import AdapterRegistry


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = Database(f"sqlite:///{tmp_path / 'fairserve.db'}")
    database.upgrade()
    yield database
    database.dispose()


def test_tenants_see_public_and_their_own_adapters_only(db: Database) -> None:
    store = BillingStore(db)
    alice, bob = store.create_tenant("alice").id, store.create_tenant("bob").id
    registry = AdapterRegistry(db, {"tuned": "/srv/tuned"})
    registry.store.add("alice-only", "/srv/alice", alice)
    registry.store.add("shared", "/srv/shared", None)
    registry.reload()
    assert [a.name for a in registry.listed(alice)] == ["tuned", "alice-only", "shared"]
    assert [a.name for a in registry.listed(bob)] == ["tuned", "shared"]
    found = registry.visible("alice-only", alice)
    assert found is not None and found.path == "/srv/alice"
    assert registry.visible("alice-only", bob) is None  # as if it did not exist
    assert registry.visible("nope", alice) is None
    assert registry.taken("alice-only") and registry.taken("tuned")


def test_another_gateways_change_shows_after_reload(db: Database) -> None:
    here, there = AdapterRegistry(db, {}), AdapterRegistry(db, {})
    there.store.add("late", "/srv/late", None)
    assert here.visible("late", "anyone") is None
    here.reload()
    assert here.visible("late", "anyone") is not None
    there.store.remove("late")
    here.reload()
    assert here.visible("late", "anyone") is None


def test_a_config_adapter_keeps_its_name(db: Database) -> None:
    tenant = BillingStore(db).create_tenant("t").id
    stored = AdapterRegistry(db, {})
    stored.store.add("tuned", "/srv/stored", tenant)  # registered before the config named it
    registry = AdapterRegistry(db, {"tuned": "/srv/config"})
    registry.reload()
    adapter = registry.visible("tuned", "other")
    assert adapter is not None and adapter.path == "/srv/config" and adapter.tenant_id is None
