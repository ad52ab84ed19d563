"""BillingStore: the tenants / API keys / usage / audit repository over one Database."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import date, datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from billing.db import Database
from billing.degradations import ServedSummary, served_by_tenant
from billing.errors import KeyNotFound, TenantExists, TenantNotFound
from billing.keys import display_prefix, generate_secret, hash_secret, hashes_match, is_well_formed
from billing.models import ApiKeyRow, AuditRow, TenantRow, UsageDailyRow, UsageRow, utcnow
from billing.records import ApiKeyInfo, AuditEntry, DailyUsage, Tenant, UsageSummary
from billing.tasks import TaskReport, WastedShare, task_report, wasted_by_tenant
from billing.validation import TENANT_FIELDS, check_tenant_fields

# Writing last_used_at on every verification would turn auth into a write path; once a minute is plenty.
LAST_USED_RESOLUTION = timedelta(seconds=60)


def _tenant(row: TenantRow) -> Tenant:
    return Tenant(
        id=row.id,
        name=row.name,
        weight=row.weight,
        priority_class=row.priority_class,
        tokens_per_minute=row.tokens_per_minute,
        tokens_per_day=row.tokens_per_day,
        max_queued_requests=row.max_queued_requests,
        cache_group=row.cache_group,
        on_infeasible=row.on_infeasible,
        disabled=row.disabled,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


def _key(row: ApiKeyRow) -> ApiKeyInfo:
    return ApiKeyInfo(
        id=row.id,
        tenant_id=row.tenant_id,
        prefix=row.prefix,
        name=row.name,
        created_at=row.created_at,
        last_used_at=row.last_used_at,
        revoked_at=row.revoked_at,
    )


def _snapshot(row: TenantRow) -> dict[str, Any]:
    return {name: getattr(row, name) for name in TENANT_FIELDS}


_USAGE_EXISTS = (
    select(UsageRow.request_id)
    .where(UsageRow.tenant_id == bindparam("tid"), UsageRow.request_id == bindparam("rid"))
    .limit(1)
)


class BillingStore:
    """Tenants, API keys, usage summaries and the audit log, over SQLAlchemy sessions."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._sessions = sessionmaker(db.engine, expire_on_commit=False)

    @contextmanager
    def _session(self) -> Iterator[Session]:
        with self._sessions.begin() as session:
            yield session

    # -- tenants ---------------------------------------------------------------------------------

    def _find_tenant(self, session: Session, tenant_id_or_name: str) -> TenantRow | None:
        row = session.get(TenantRow, tenant_id_or_name)
        if row is None:
            row = session.scalars(select(TenantRow).where(TenantRow.name == tenant_id_or_name)).first()
        return row

    def _audit(
        self,
        session: Session,
        actor: str,
        action: str,
        tenant_id: str | None,
        before: dict[str, Any] | None,
        after: dict[str, Any] | None,
    ) -> None:
        session.add(
            AuditRow(actor=actor, action=action, tenant_id=tenant_id, before=before, after=after, at=utcnow())
        )

    def create_tenant(
        self,
        name: str,
        weight: float = 1.0,
        priority_class: int = 1,
        tokens_per_minute: int | None = None,
        tokens_per_day: int | None = None,
        max_queued_requests: int | None = None,
        cache_group: str | None = None,
        on_infeasible: str | None = None,
        actor: str = "cli",
    ) -> Tenant:
        """Create a tenant; raises TenantExists when the name is taken, ValueError on bad fields."""
        fields = check_tenant_fields(
            {
                "name": name,
                "weight": weight,
                "priority_class": priority_class,
                "tokens_per_minute": tokens_per_minute,
                "tokens_per_day": tokens_per_day,
                "max_queued_requests": max_queued_requests,
                "cache_group": cache_group,
                "on_infeasible": on_infeasible,
            }
        )
        now = utcnow()
        row = TenantRow(id=uuid.uuid4().hex, disabled=False, created_at=now, updated_at=now, **fields)
        try:
            with self._session() as session:
                if session.scalars(select(TenantRow.id).where(TenantRow.name == fields["name"])).first():
                    raise TenantExists(f"tenant {fields['name']!r} already exists")
                session.add(row)
                session.flush()
                self._audit(session, actor, "tenant.create", row.id, None, _snapshot(row))
        except IntegrityError as exc:  # a concurrent create won the race on the unique name
            raise TenantExists(f"tenant {fields['name']!r} already exists") from exc
        return _tenant(row)

    def get_tenant(self, tenant_id_or_name: str) -> Tenant | None:
        """The tenant with this id, or else with this name; None when neither exists."""
        with self._session() as session:
            row = self._find_tenant(session, tenant_id_or_name)
            return _tenant(row) if row else None

    def list_tenants(self) -> list[Tenant]:
        """Every tenant, by name."""
        with self._session() as session:
            return [_tenant(r) for r in session.scalars(select(TenantRow).order_by(TenantRow.name))]

    def update_tenant(self, tenant_id: str, actor: str = "cli", **fields: Any) -> Tenant:
        """Change some tenant fields (by id or name) and audit the change; raises TenantNotFound / ValueError."""
        clean = check_tenant_fields(fields)
        try:
            with self._session() as session:
                row = self._find_tenant(session, tenant_id)
                if row is None:
                    raise TenantNotFound(f"no tenant {tenant_id!r}")
                if "name" in clean and clean["name"] != row.name:
                    taken = session.scalars(
                        select(TenantRow.id).where(TenantRow.name == clean["name"])
                    ).first()
                    if taken:
                        raise TenantExists(f"tenant {clean['name']!r} already exists")
                before = _snapshot(row)
                for key, value in clean.items():
                    setattr(row, key, value)
                row.updated_at = utcnow()
                self._audit(session, actor, "tenant.update", row.id, before, _snapshot(row))
        except IntegrityError as exc:
            raise TenantExists(f"tenant {clean.get('name')!r} already exists") from exc
        return _tenant(row)

    # -- keys ------------------------------------------------------------------------------------

    def create_key(self, tenant_id: str, name: str = "default", actor: str = "cli") -> tuple[str, ApiKeyInfo]:
        """Issue a key for a tenant (id or name). Returns (secret, info); the secret is not stored and not recoverable."""
        if not isinstance(name, str) or not name.strip() or len(name) > 128:
            raise ValueError("key name must be a non-empty string of at most 128 characters")
        secret = generate_secret()
        with self._session() as session:
            tenant = self._find_tenant(session, tenant_id)
            if tenant is None:
                raise TenantNotFound(f"no tenant {tenant_id!r}")
            row = ApiKeyRow(
                id=uuid.uuid4().hex,
                tenant_id=tenant.id,
                prefix=display_prefix(secret),
                key_hash=hash_secret(secret),
                name=name.strip(),
                created_at=utcnow(),
            )
            session.add(row)
            self._audit(
                session, actor, "key.create", tenant.id, None, {"key_id": row.id, "prefix": row.prefix}
            )
        return secret, _key(row)

    def list_keys(self, tenant_id: str | None = None) -> list[ApiKeyInfo]:
        """Keys of one tenant (id or name), or of all tenants; revoked keys included."""
        with self._session() as session:
            query = select(ApiKeyRow).order_by(ApiKeyRow.created_at)
            if tenant_id is not None:
                tenant = self._find_tenant(session, tenant_id)
                if tenant is None:
                    raise TenantNotFound(f"no tenant {tenant_id!r}")
                query = query.where(ApiKeyRow.tenant_id == tenant.id)
            return [_key(r) for r in session.scalars(query)]

    def revoke_key(self, key_id: str, actor: str = "cli") -> ApiKeyInfo:
        """Revoke a key by id or display prefix; idempotent. Raises KeyNotFound."""
        with self._session() as session:
            row = session.get(ApiKeyRow, key_id)
            if row is None:
                matches = list(session.scalars(select(ApiKeyRow).where(ApiKeyRow.prefix == key_id)).all())
                if len(matches) > 1:
                    raise KeyNotFound(f"prefix {key_id!r} matches {len(matches)} keys; use the key id")
                row = matches[0] if matches else None
            if row is None:
                raise KeyNotFound(f"no API key {key_id!r}")
            if row.revoked_at is None:
                row.revoked_at = utcnow()
                self._audit(
                    session,
                    actor,
                    "key.revoke",
                    row.tenant_id,
                    None,
                    {"key_id": row.id, "prefix": row.prefix},
                )
        return _key(row)

    def verify_key(self, secret: str) -> tuple[Tenant, ApiKeyInfo] | None:
        """The tenant and key a secret belongs to; None when malformed, unknown, revoked or the tenant is disabled."""
        if not is_well_formed(secret):
            return None
        digest = hash_secret(secret)
        with self._session() as session:
            row = session.scalars(select(ApiKeyRow).where(ApiKeyRow.key_hash == digest)).first()
            # The index lookup is on the digest, not the secret; compare again in constant time anyway.
            if row is None or not hashes_match(row.key_hash, secret) or row.revoked_at is not None:
                return None
            tenant = session.get(TenantRow, row.tenant_id)
            if tenant is None or tenant.disabled:
                return None
            now = utcnow()
            if row.last_used_at is None or now - row.last_used_at > LAST_USED_RESOLUTION:
                row.last_used_at = now
            return _tenant(tenant), _key(row)

    # -- usage and audit ---------------------------------------------------------------------------

    def usage_summary(
        self, tenant_id: str | None = None, since: datetime | None = None, until: datetime | None = None
    ) -> list[UsageSummary]:
        """Per-tenant totals of requests (by status), tokens by kind and charged service, finished in [since, until)."""
        with self._session() as session:
            query = select(
                UsageRow.tenant_id,
                UsageRow.status,
                func.count(),
                func.sum(UsageRow.prompt_tokens),
                func.sum(UsageRow.cached_tokens),
                func.sum(UsageRow.completion_tokens),
                func.sum(UsageRow.charged_service),
                func.sum(UsageRow.tokens_after_cancel),
                func.sum(UsageRow.preemptions),
                func.sum(UsageRow.recomputed_tokens),
            ).group_by(UsageRow.tenant_id, UsageRow.status)
            names: dict[str, str] = {r.id: r.name for r in session.scalars(select(TenantRow))}
            if tenant_id is not None:
                tenant = self._find_tenant(session, tenant_id)
                query = query.where(UsageRow.tenant_id == (tenant.id if tenant else tenant_id))
            if since is not None:
                query = query.where(UsageRow.finished_at >= since)
            if until is not None:
                query = query.where(UsageRow.finished_at < until)
            summaries: dict[str, UsageSummary] = {}
            for (
                tid,
                status,
                count,
                prompt,
                cached,
                completion,
                service,
                after,
                preempt,
                recomputed,
            ) in session.execute(query):
                s = summaries.setdefault(tid, UsageSummary(tenant_id=tid, tenant_name=names.get(tid)))
                s.requests += count
                s.requests_by_status[status] = count
                s.prompt_tokens += int(prompt or 0)
                s.cached_tokens += int(cached or 0)
                s.completion_tokens += int(completion or 0)
                s.charged_service += float(service or 0.0)
                s.tokens_after_cancel += int(after or 0)
                s.preemptions += int(preempt or 0)
                s.recomputed_tokens += int(recomputed or 0)
            return sorted(summaries.values(), key=lambda s: s.tenant_name or s.tenant_id)

    def task_report(
        self, tenant_id: str, task_id: str | None = None, workflow_run_id: str | None = None
    ) -> TaskReport | None:
        """Attempts, outcomes and wasted tokens of a tenant's task or workflow run (billing/tasks.py)."""
        with self._session() as session:
            return task_report(session, tenant_id, task_id, workflow_run_id)

    def wasted_share(self, since: datetime, until: datetime | None = None) -> list[WastedShare]:
        """Per tenant: engine tokens finished in [since, until) and those cancelled or replaced by a retry."""
        with self._session() as session:
            return wasted_by_tenant(session, since, until)

    def served_share(self, since: datetime, until: datetime | None = None) -> list[ServedSummary]:
        """Per tenant: requests by serving model and by degradation, finished in [since, until)."""
        with self._session() as session:
            return served_by_tenant(session, since, until)

    def daily_usage(
        self, tenant_id: str | None = None, since: date | None = None, until: date | None = None
    ) -> list[DailyUsage]:
        """Rows of the daily rollup (UTC days in [since, until]), oldest first."""
        with self._session() as session:
            query = select(UsageDailyRow).order_by(
                UsageDailyRow.day, UsageDailyRow.tenant_id, UsageDailyRow.status
            )
            if tenant_id is not None:
                tenant = self._find_tenant(session, tenant_id)
                query = query.where(UsageDailyRow.tenant_id == (tenant.id if tenant else tenant_id))
            if since is not None:
                query = query.where(UsageDailyRow.day >= since)
            if until is not None:
                query = query.where(UsageDailyRow.day <= until)
            return [
                DailyUsage(
                    day=r.day.isoformat(),
                    tenant_id=r.tenant_id,
                    status=r.status,
                    requests=r.requests,
                    prompt_tokens=r.prompt_tokens,
                    cached_tokens=r.cached_tokens,
                    completion_tokens=r.completion_tokens,
                    charged_service=r.charged_service,
                    tokens_after_cancel=r.tokens_after_cancel,
                    preemptions=r.preemptions,
                    recomputed_tokens=r.recomputed_tokens,
                )
                for r in session.scalars(query)
            ]

    def usage_exists(self, tenant_id: str, request_id: str) -> bool:
        """True when the ledger holds a row for this tenant's `request_id` (a client reusing its X-Request-Id).

        Ids are scoped to the tenant: another tenant's use of the same string is invisible here.
        """
        # Core, not the ORM: this runs for every request that names its own id (about 6x cheaper).
        with self.db.engine.connect() as conn:
            return conn.execute(_USAGE_EXISTS, {"tid": tenant_id, "rid": request_id}).first() is not None

    def list_audit(self, limit: int = 100, tenant_id: str | None = None) -> list[AuditEntry]:
        """The newest audit entries first, optionally for one tenant."""
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise ValueError(f"limit must be a positive integer, got {limit!r}")
        with self._session() as session:
            query = select(AuditRow).order_by(AuditRow.id.desc()).limit(limit)
            if tenant_id is not None:
                tenant = self._find_tenant(session, tenant_id)
                query = query.where(AuditRow.tenant_id == (tenant.id if tenant else tenant_id))
            return [
                AuditEntry(
                    id=r.id,
                    actor=r.actor,
                    action=r.action,
                    tenant_id=r.tenant_id,
                    before=r.before,
                    after=r.after,
                    at=r.at,
                )
                for r in session.scalars(query)
            ]
