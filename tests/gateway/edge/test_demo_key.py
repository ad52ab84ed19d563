"""The demo key is minted once per deployment, not once per replica's fresh data directory."""

from __future__ import annotations

from pathlib import Path

from billing import BillingStore, Database, default_db_url
from gateway.edge.auth import ensure_demo_key


def test_replicas_on_one_database_share_the_first_demo_key(tmp_path: Path) -> None:
    db = Database(default_db_url(tmp_path / "shared"))
    db.upgrade()
    store = BillingStore(db)
    first = ensure_demo_key(store, tmp_path / "shared", "demo")
    assert first is not None and store.verify_key(first) is not None
    assert ensure_demo_key(store, tmp_path / "shared", "demo") == first  # a restart keeps it
    (tmp_path / "replica").mkdir()
    assert ensure_demo_key(store, tmp_path / "replica", "demo") is None  # a fresh replica mints none
    demo = store.get_tenant("demo")
    assert demo is not None and len(store.list_keys(demo.id)) == 1
    db.dispose()
