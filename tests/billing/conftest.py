"""Fixtures: a migrated SQLite database per test, and a fresh PostgreSQL database per test run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from billing import BillingStore, Database
from tests.billing.services import PG_HOST, PG_PORT, fresh_pg_database, require


@pytest.fixture
def sqlite_db(tmp_path: Path) -> Iterator[Database]:
    """A migrated SQLite database in a temporary directory."""
    db = Database(f"sqlite:///{tmp_path / 'fairserve.db'}")
    db.upgrade()
    yield db
    db.dispose()


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """URL of a uniquely named PostgreSQL database, created for this run and dropped after it."""
    require(PG_HOST, PG_PORT, "PostgreSQL")
    with fresh_pg_database() as url:
        yield url


@pytest.fixture
def pg_db(pg_url: str) -> Iterator[Database]:
    """The run's PostgreSQL database, migrated to head and emptied after the test."""
    db = Database(pg_url)
    db.upgrade()
    yield db
    db.downgrade()
    db.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def any_db(request: pytest.FixtureRequest) -> Database:
    """Each test that takes this runs once on SQLite and once on PostgreSQL."""
    return request.getfixturevalue("sqlite_db" if request.param == "sqlite" else "pg_db")  # type: ignore[no-any-return]


@pytest.fixture
def store(any_db: Database) -> BillingStore:
    """A BillingStore over each dialect."""
    return BillingStore(any_db)
