"""Database handle: one SQLAlchemy engine per URL, Alembic upgrade/downgrade, liveness ping."""

from __future__ import annotations

import importlib.util
import logging
import re
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, inspect, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

log = logging.getLogger(__name__)

# The Alembic environment lives in the top-level `migrations` package; it is named here as a resource
# location (not imported), so billing stays below migrations in the layer order.
MIGRATIONS_LOCATION = "migrations:"
# Our own version table, so fairserve can share a PostgreSQL database with other Alembic users.
VERSION_TABLE = "fairserve_alembic_version"
SUPPORTED_DIALECTS = ("sqlite", "postgresql")
# Bound how long a dead PostgreSQL can stall a connect; the ledger retries with backoff anyway.
DEFAULT_CONNECT_TIMEOUT_S = 5


def default_db_url(data_dir: str | Path) -> str:
    """The embedded default: `sqlite:///<data_dir>/fairserve.db`; creates the data directory."""
    path = Path(data_dir).expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path / 'fairserve.db'}"


def _parse_url(url: str) -> URL:
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise ValueError(f"invalid database URL {url!r}: expected e.g. sqlite:///data/fairserve.db") from exc
    if parsed.get_backend_name() not in SUPPORTED_DIALECTS:
        raise ValueError(
            f"unsupported database {parsed.get_backend_name()!r}: use sqlite:///PATH or postgresql+psycopg://..."
        )
    if parsed.get_backend_name() == "postgresql" and parsed.get_driver_name() not in ("psycopg", ""):
        raise ValueError(
            f"unsupported PostgreSQL driver {parsed.get_driver_name()!r}: use postgresql+psycopg://"
        )
    if parsed.get_backend_name() == "postgresql" and not parsed.get_driver_name():
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    # WAL lets the ledger thread write while the gateway reads; foreign keys are off by default in SQLite.
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


class Database:
    """A database by URL (SQLite file or PostgreSQL via psycopg 3), with its migrations."""

    def __init__(self, url: str) -> None:
        parsed = _parse_url(url)
        self.url = parsed
        self.dialect = parsed.get_backend_name()
        kwargs: dict[str, Any] = {"pool_pre_ping": True}
        if self.dialect == "sqlite":
            database = parsed.database or ""
            if database and database != ":memory:" and not database.startswith("file:"):
                Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        else:
            if "connect_timeout" not in parsed.query:
                kwargs["connect_args"] = {"connect_timeout": DEFAULT_CONNECT_TIMEOUT_S}
            kwargs["pool_size"] = 5
            kwargs["max_overflow"] = 5
        self.engine: Engine = create_engine(parsed, **kwargs)
        if self.dialect == "sqlite":
            event.listen(self.engine, "connect", _sqlite_pragmas)

    def __repr__(self) -> str:
        return f"Database({self.url.render_as_string(hide_password=True)!r})"

    def _alembic_config(self) -> Any:
        from alembic.config import Config

        cfg = Config()
        cfg.set_main_option("script_location", MIGRATIONS_LOCATION)
        return cfg

    def upgrade(self, revision: str = "head") -> None:
        """Apply the Alembic migrations up to `revision` (default: head); a no-op when already there."""
        from alembic import command

        cfg = self._alembic_config()
        with self.engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)

    def downgrade(self, rev: str = "base") -> None:
        """Revert the migrations down to `rev` (default: base, i.e. drop every table)."""
        from alembic import command

        cfg = self._alembic_config()
        with self.engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, rev)

    def current_revision(self) -> str | None:
        """The revision the database is at, or None before the first upgrade. Read with one query rather than
        Alembic's MigrationContext (the history is linear: one row), so a CLI read never imports Alembic."""
        with self.engine.connect() as conn:
            if not inspect(conn).has_table(VERSION_TABLE):
                return None
            found = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar()
            return None if found is None else str(found)

    def head_revision(self) -> str | None:
        """The newest revision the migrations package knows, as Alembic computes it."""
        from alembic.script import ScriptDirectory

        return ScriptDirectory.from_config(self._alembic_config()).get_current_head()

    def at_head(self) -> bool:
        """Whether the database is at the migrations' newest revision, read from their files' `revision` and
        `down_revision` lines (`scripted_head`) rather than through Alembic: about a third of a CLI call's
        second went to importing it and loading every migration (tests/billing/test_migrations.py checks
        that both heads agree)."""
        return self.current_revision() == scripted_head()

    def ping(self) -> bool:
        """True when a trivial query succeeds; never raises."""
        try:
            with self.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
            return True
        except SQLAlchemyError as exc:
            log.debug("database ping failed: %s", exc)
            return False

    def dispose(self) -> None:
        """Close pooled connections."""
        self.engine.dispose()


_REVISION = re.compile(r"^revision\s*(?::[^=]*)?=\s*[\"']([^\"']+)[\"']", re.MULTILINE)
_DOWN_REVISION = re.compile(r"^down_revision\s*(?::[^=]*)?=\s*[\"']([^\"']+)[\"']", re.MULTILINE)


def scripted_head() -> str | None:
    """The migrations' head, read from their files: the revision no other file names as its
    `down_revision` (a linear history has one). The package is found, not imported (billing never imports
    the migrations, which import billing's models)."""
    spec = importlib.util.find_spec(MIGRATIONS_LOCATION.rstrip(":"))
    if spec is None or not spec.submodule_search_locations:
        return None
    versions = Path(next(iter(spec.submodule_search_locations))) / "versions"
    revisions: set[str] = set()
    downs: set[str] = set()
    for path in versions.glob("*.py"):
        source = path.read_text()
        revisions.update(_REVISION.findall(source))
        downs.update(_DOWN_REVISION.findall(source))
    heads = revisions - downs
    return heads.pop() if len(heads) == 1 else None
