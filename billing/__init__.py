"""Tenants, API keys and the per-tenant usage ledger in SQL (SQLite by default, PostgreSQL by URL)."""

from billing.db import Database, default_db_url
from billing.errors import BillingError, KeyNotFound, StoreUnavailable, TenantExists, TenantNotFound
from billing.key_cache import KeyCache
from billing.ledger import Ledger
from billing.ledger_config import LedgerConfig
from billing.records import (
    CANCEL_STATES,
    USAGE_STATUSES,
    ApiKeyInfo,
    AuditEntry,
    DailyUsage,
    Tenant,
    UsageRecord,
    UsageSummary,
)
from billing.store import BillingStore

__all__ = [
    "CANCEL_STATES",
    "USAGE_STATUSES",
    "ApiKeyInfo",
    "AuditEntry",
    "BillingError",
    "BillingStore",
    "DailyUsage",
    "Database",
    "KeyCache",
    "KeyNotFound",
    "Ledger",
    "LedgerConfig",
    "StoreUnavailable",
    "Tenant",
    "TenantExists",
    "TenantNotFound",
    "UsageRecord",
    "UsageSummary",
    "default_db_url",
]
