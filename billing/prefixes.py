"""PrefixStore: the registry of public prompt prefixes in SQL, so it survives restarts and every gateway
(hence every engine it routes to) reads the same one. Adding and removing are audited like tenant changes."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from billing.db import Database
from billing.errors import BillingError
from billing.models import AuditRow, PublicPrefixRow, utcnow

# Bounds on what an operator may register: the gateway compares every prompt with each of a model's
# prefixes (a slice compare each), so their number and length are capped.
MAX_PREFIXES_PER_MODEL = 64
MAX_PREFIX_TOKENS = 32_768
MAX_NAME_LENGTH = 128


class PrefixExists(BillingError):
    """A prefix of that name is already registered for that model."""


class PrefixNotFound(BillingError):
    """No registered prefix has that id (or model and name)."""


class TooManyPrefixes(BillingError):
    """The model already has MAX_PREFIXES_PER_MODEL prefixes."""


@dataclass(frozen=True)
class PrefixInfo:
    """One registered public prefix as stored."""

    id: str
    model: str
    name: str
    text: str | None
    token_ids: tuple[int, ...]
    created_at: datetime


def _info(row: PublicPrefixRow) -> PrefixInfo:
    return PrefixInfo(row.id, row.model, row.name, row.text, tuple(row.token_ids), row.created_at)


def _audited(info: PrefixInfo) -> dict[str, object]:
    return {"id": info.id, "model": info.model, "name": info.name, "tokens": len(info.token_ids)}


class PrefixStore:
    """Add, list and remove public prefixes; every change is written to the audit log."""

    def __init__(self, db: Database) -> None:
        self._sessions = sessionmaker(db.engine, expire_on_commit=False)

    @contextmanager
    def _session(self) -> Iterator[Session]:
        with self._sessions.begin() as session:
            yield session

    def add(
        self, model: str, name: str, token_ids: Sequence[int], text: str | None, actor: str = "cli"
    ) -> PrefixInfo:
        """Register a prefix; PrefixExists on a duplicate (model, name), TooManyPrefixes over the cap."""
        row = PublicPrefixRow(
            id=str(uuid.uuid4()),
            model=model,
            name=name,
            text=text,
            token_ids=list(token_ids),
            created_at=utcnow(),
        )
        try:
            with self._session() as session:
                count = len(
                    session.scalars(select(PublicPrefixRow.id).where(PublicPrefixRow.model == model)).all()
                )
                if count >= MAX_PREFIXES_PER_MODEL:
                    raise TooManyPrefixes(f"model {model!r} already has {count} public prefixes")
                session.add(row)
                session.flush()
                info = _info(row)
                session.add(AuditRow(actor=actor, action="prefix.add", after=_audited(info), at=utcnow()))
        except IntegrityError:
            raise PrefixExists(f"model {model!r} already has a public prefix named {name!r}") from None
        return info

    def list(self, model: str | None = None) -> list[PrefixInfo]:
        """Every registered prefix (of one model if given), oldest first."""
        with self._session() as session:
            query = select(PublicPrefixRow).order_by(PublicPrefixRow.created_at, PublicPrefixRow.id)
            if model is not None:
                query = query.where(PublicPrefixRow.model == model)
            return [_info(row) for row in session.scalars(query)]

    def remove(self, ref: str, model: str | None = None, actor: str = "cli") -> PrefixInfo:
        """Unregister a prefix by id, or by name (within `model` when given); PrefixNotFound otherwise."""
        with self._session() as session:
            row = session.get(PublicPrefixRow, ref)
            if row is None:
                query = select(PublicPrefixRow).where(PublicPrefixRow.name == ref)
                if model is not None:
                    query = query.where(PublicPrefixRow.model == model)
                rows = session.scalars(query).all()
                if len(rows) > 1:
                    raise PrefixNotFound(f"{len(rows)} prefixes are named {ref!r}: give the model or the id")
                row = rows[0] if rows else None
            if row is None:
                raise PrefixNotFound(f"no public prefix {ref!r}")
            info = _info(row)
            session.delete(row)
            session.add(AuditRow(actor=actor, action="prefix.remove", before=_audited(info), at=utcnow()))
        return info
