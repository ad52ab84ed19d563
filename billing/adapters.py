"""AdapterStore: the directory of LoRA adapters registered at run time, in SQL so it survives restarts and
every gateway resolves `model: NAME` the same way. Adding and removing are audited like tenant changes."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from billing.db import Database
from billing.errors import BillingError
from billing.models import AuditRow, LoraAdapterRow, utcnow

# /v1/models lists every public adapter and the request path looks names up in memory: the directory is
# capped so neither grows without bound.
MAX_ADAPTERS = 1024


class AdapterExists(BillingError):
    """An adapter of that name is already registered."""


class AdapterNotFound(BillingError):
    """No registered adapter has that name."""


class TooManyAdapters(BillingError):
    """MAX_ADAPTERS adapters are already registered."""


@dataclass(frozen=True)
class AdapterInfo:
    """One adapter: its PEFT directory and owner (None: public, every tenant may use it)."""

    name: str
    path: str
    tenant_id: str | None
    created_at: datetime | None  # None: a `--lora` adapter from the server's config, never stored
    actor: str


def _info(row: LoraAdapterRow) -> AdapterInfo:
    return AdapterInfo(row.name, row.path, row.tenant_id, row.created_at, row.actor)


def _audited(info: AdapterInfo) -> dict[str, object]:
    return {"name": info.name, "path": info.path, "tenant_id": info.tenant_id}


class AdapterStore:
    """Add, list and remove run-time adapters; every change is written to the audit log."""

    def __init__(self, db: Database) -> None:
        self._sessions = sessionmaker(db.engine, expire_on_commit=False)

    @contextmanager
    def _session(self) -> Iterator[Session]:
        with self._sessions.begin() as session:
            yield session

    def add(self, name: str, path: str, tenant_id: str | None, actor: str = "cli") -> AdapterInfo:
        """Register an adapter; AdapterExists on a taken name, TooManyAdapters over the cap."""
        row = LoraAdapterRow(name=name, path=path, tenant_id=tenant_id, created_at=utcnow(), actor=actor)
        try:
            with self._session() as session:
                count = session.scalar(select(func.count()).select_from(LoraAdapterRow)) or 0
                if count >= MAX_ADAPTERS:
                    raise TooManyAdapters(f"{count} adapters are registered (at most {MAX_ADAPTERS})")
                session.add(row)
                session.flush()
                info = _info(row)
                session.add(
                    AuditRow(
                        actor=actor,
                        action="adapter.add",
                        tenant_id=tenant_id,
                        after=_audited(info),
                        at=utcnow(),
                    )
                )
        except IntegrityError:
            raise AdapterExists(f"an adapter named {name!r} is already registered") from None
        return info

    def list(self) -> list[AdapterInfo]:
        """Every registered adapter, oldest first."""
        with self._session() as session:
            query = select(LoraAdapterRow).order_by(LoraAdapterRow.created_at, LoraAdapterRow.name)
            return [_info(row) for row in session.scalars(query)]

    def remove(self, name: str, actor: str = "cli") -> AdapterInfo:
        """Unregister an adapter by name; AdapterNotFound when none has it."""
        with self._session() as session:
            row = session.get(LoraAdapterRow, name)
            if row is None:
                raise AdapterNotFound(f"no adapter {name!r}")
            info = _info(row)
            session.delete(row)
            session.add(
                AuditRow(
                    actor=actor,
                    action="adapter.remove",
                    tenant_id=info.tenant_id,
                    before=_audited(info),
                    at=utcnow(),
                )
            )
        return info
