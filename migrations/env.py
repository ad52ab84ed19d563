"""Alembic environment: runs on the connection `billing.Database` passes in, or on `sqlalchemy.url`."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Connection

from billing.db import VERSION_TABLE
from billing.models import Base

target_metadata = Base.metadata
# Serialises concurrent upgrades from several gateway replicas starting at once (PostgreSQL only).
ADVISORY_LOCK_KEY = 0x66616972  # "fair"


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        version_table=VERSION_TABLE,
        # SQLite cannot ALTER most things in place; batch mode rebuilds tables for later migrations.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )


def run_online() -> None:
    """Migrate over a live connection."""
    connection = context.config.attributes.get("connection")
    if connection is None:
        url = context.config.get_main_option("sqlalchemy.url")
        if not url:
            raise RuntimeError("no connection passed and no sqlalchemy.url configured")
        with create_engine(url).begin() as conn:
            _run_on(conn)
    else:
        _run_on(connection)


def _run_on(connection: Connection) -> None:
    _configure(connection)
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": ADVISORY_LOCK_KEY})
        context.run_migrations()


def run_offline() -> None:
    """Emit SQL instead of running it (`alembic upgrade --sql`)."""
    context.configure(
        url=context.config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        version_table=VERSION_TABLE,
        literal_binds=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
