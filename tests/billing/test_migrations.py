"""Migrations upgrade and downgrade on SQLite and PostgreSQL; the models match them and round-trip."""

from __future__ import annotations

from datetime import UTC, datetime

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, select
from sqlalchemy.orm import Session

from billing import Database
from billing.db import VERSION_TABLE, scripted_head
from billing.models import ApiKeyRow, AuditRow, Base, TenantRow, UsageDailyRow

TABLES = {"tenants", "api_keys", "usage", "usage_daily", "audit_log"}


def test_upgrade_downgrade_upgrade(any_db: Database) -> None:
    assert set(inspect(any_db.engine).get_table_names()) >= TABLES
    assert any_db.current_revision() == any_db.head_revision() == scripted_head() is not None
    assert any_db.at_head()
    any_db.downgrade("base")
    assert not TABLES & set(inspect(any_db.engine).get_table_names())
    assert any_db.current_revision() is None and not any_db.at_head()
    any_db.downgrade("base")  # the version table is gone or empty: still None
    assert any_db.current_revision() is None
    any_db.upgrade("0013_usage_service_nonnegative")
    assert any_db.current_revision() == "0013_usage_service_nonnegative" and not any_db.at_head()
    any_db.upgrade()
    any_db.upgrade()  # a second upgrade at head is a no-op, as on every server start
    assert set(inspect(any_db.engine).get_table_names()) >= TABLES


def test_models_match_migrations(any_db: Database) -> None:
    with any_db.engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE, "compare_type": False})
        diff = compare_metadata(ctx, Base.metadata)
    assert diff == []


def test_models_round_trip(any_db: Database) -> None:
    now = datetime(2026, 5, 1, 12, 30, 15, 123000, tzinfo=UTC)
    with Session(any_db.engine) as session, session.begin():
        session.add(
            TenantRow(
                id="t1",
                name="acme",
                weight=2.5,
                priority_class=0,
                tokens_per_minute=10**10,
                tokens_per_day=None,
                max_queued_requests=7,
                disabled=False,
                created_at=now,
                updated_at=now,
            )
        )
        session.flush()
        session.add(
            ApiKeyRow(
                id="k1", tenant_id="t1", prefix="fsk_abcdefgh", key_hash="0" * 64, name="ci", created_at=now
            )
        )
        session.add(
            AuditRow(
                actor="test",
                action="tenant.create",
                tenant_id="t1",
                before=None,
                after={"weight": 2.5, "nested": [1, None]},
                at=now,
            )
        )
        session.add(
            UsageDailyRow(
                day=now.date(),
                tenant_id="t1",
                status="completed",
                requests=3,
                prompt_tokens=2**40,
                cached_tokens=0,
                completion_tokens=1,
                charged_service=0.25,
                tokens_after_cancel=0,
                preemptions=0,
                recomputed_tokens=0,
            )
        )
    with Session(any_db.engine) as session:
        tenant = session.get(TenantRow, "t1")
        assert tenant is not None
        assert (tenant.name, tenant.weight, tenant.tokens_per_minute, tenant.tokens_per_day) == (
            "acme",
            2.5,
            10**10,
            None,
        )
        assert tenant.created_at == now and tenant.created_at.tzinfo is not None
        key = session.scalars(select(ApiKeyRow)).one()
        assert key.tenant_id == "t1" and key.revoked_at is None
        audit = session.scalars(select(AuditRow)).one()
        assert audit.after == {"weight": 2.5, "nested": [1, None]}
        daily = session.scalars(select(UsageDailyRow)).one()
        assert daily.day == now.date() and daily.prompt_tokens == 2**40


def test_default_db_url_creates_the_data_dir(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from billing import default_db_url

    url = default_db_url(tmp_path / "nested" / "data")
    assert (tmp_path / "nested" / "data").is_dir()
    assert url == f"sqlite:///{tmp_path / 'nested' / 'data' / 'fairserve.db'}"
    db = Database(url)
    db.upgrade()
    assert (tmp_path / "nested" / "data" / "fairserve.db").is_file()


def test_bad_urls_are_refused_with_a_clear_message() -> None:
    import pytest

    for url, fragment in (
        ("mysql://u@h/db", "unsupported database"),
        ("not a url", "invalid database URL"),
        ("postgresql+asyncpg://h/db", "unsupported PostgreSQL driver"),
    ):
        with pytest.raises(ValueError, match=fragment):
            Database(url)
