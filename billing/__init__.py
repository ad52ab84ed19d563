"""Tenants, API keys and the per-tenant usage ledger in SQL (SQLite by default, PostgreSQL by URL).

Its names load on first use (PEP 562 `__getattr__`), as `engine`'s do: `fairserve tenants list` reads the
store and must answer in under a second, and importing the write-behind ledger (its journal, its SQL
batches) alone took about a second of that on this machine.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

_EXPORTS: dict[str, str] = {
    "Database": "billing.db",
    "default_db_url": "billing.db",
    "BillingError": "billing.errors",
    "KeyNotFound": "billing.errors",
    "StoreUnavailable": "billing.errors",
    "TenantExists": "billing.errors",
    "TenantNotFound": "billing.errors",
    "KeyCache": "billing.key_cache",
    "Ledger": "billing.ledger",
    "LedgerConfig": "billing.ledger_config",
    "CANCEL_STATES": "billing.records",
    "USAGE_STATUSES": "billing.records",
    "ApiKeyInfo": "billing.records",
    "AuditEntry": "billing.records",
    "DailyUsage": "billing.records",
    "Tenant": "billing.records",
    "UsageRecord": "billing.records",
    "UsageSummary": "billing.records",
    "BillingStore": "billing.store",
}

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


def __getattr__(name: str) -> Any:
    """Import the module defining `name` on first access, then keep the name here."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'billing' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
