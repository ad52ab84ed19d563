"""TenantWatch: the one path by which a changed tenant reaches a running gateway and its engines.

A tenant's weight, class, quotas and queue bound live in SQL, and anything may change them: the admin API of
this gateway or another, `fairserve tenants set`, or SQL itself. Every gateway re-reads the tenants table
every `tenant_poll_interval_s` (default 1 s) and, for each tenant that differs from its last read, pushes
a changed weight or class to its engines (`set_tenant_weight`, which an engine applies to queued requests
and to service charged from then on) and drops the tenant's cached keys, so the next request reads its new
quotas. The admin API runs the same read at once after its write, so its own change needs no wait. Polling
rather than Redis pub/sub: it needs nothing beyond the database every gateway already has, and it cannot
miss a change made while a subscriber was disconnected (docs/admin.md, "One path for tenant changes").
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

from billing import BillingStore, KeyCache
from billing.records import Tenant
from engine import EngineClient

log = logging.getLogger(__name__)


class TenantWatch:
    """The tenants as this gateway last read them, and what a new read changes."""

    def __init__(
        self,
        store: BillingStore,
        engine: EngineClient,
        keys: KeyCache,
        on_change: Callable[[list[Tenant]], None] | None = None,
    ) -> None:
        self.store = store
        self.engine = engine
        self.keys = keys
        self.on_change = on_change  # e.g. refresh metric labels and the dashboard's tenant list
        self._seen: dict[str, Tenant] | None = None
        self._lock = threading.Lock()  # the poller and the admin API may read at once

    def apply(self) -> list[Tenant]:
        """Read the tenants and apply what changed since the last read; returns the changed ones.

        The first read only remembers: a tenant's first request carries its weight from SQL. Blocking
        (a SQL query): call it off the event loop.
        """
        tenants = self.store.list_tenants()
        with self._lock:
            seen, self._seen = self._seen, {t.id: t for t in tenants}
            if seen is None:
                return []
            changed = [t for t in tenants if seen.get(t.id) != t]
            for tenant in changed:
                before = seen.get(tenant.id)
                # A tenant new since the last read may have been changed since it was created, before this
                # gateway saw it: its weight is pushed too (the engine takes the same from its requests).
                if before is None or (before.weight, before.priority_class) != (
                    tenant.weight,
                    tenant.priority_class,
                ):
                    self.engine.set_tenant_weight(tenant.id, tenant.weight, tenant.priority_class)
                if before is not None:
                    # A tenant new since the last read was cached (if at all) from a read after its
                    # creation; dropping its keys would only cost a lookup (and, for an address over its
                    # auth-failure budget, a 429 for a key that is good). The key cache's TTL bounds what a
                    # change within its first poll period takes to arrive.
                    self.keys.invalidate_tenant(tenant.id)
        if changed and self.on_change is not None:
            self.on_change(changed)
        return changed


async def keep_tenants_current(watch: TenantWatch, interval_s: float) -> None:
    """Apply the tenants table every `interval_s` until cancelled; a failed read keeps what was applied."""
    while True:
        try:
            await asyncio.to_thread(watch.apply)
        except Exception:  # a database hiccup: the next read catches up
            log.warning("could not re-read the tenants", exc_info=True)
        await asyncio.sleep(interval_s)  # the polling period, not a wait for a condition
