"""The gateway's LoRA adapter directory: the `--lora` adapters of the server's config (public) plus those
registered at run time through the admin API (billing/adapters.py), each public or private to one tenant.

`model: NAME` resolves through `visible`, which answers only with an adapter the caller's tenant may use:
another tenant's private adapter is treated exactly as a name that does not exist, so a tenant cannot
learn which adapters others have. The in-memory directory is reloaded from SQL after each change made
here and every `REFRESH_S` seconds by `keep_adapters_fresh`, so a change made through one gateway reaches
the others within that period (the path travels to the engines in each request's `RequestMeta.lora_path`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from billing import Database
from billing.adapters import AdapterInfo, AdapterStore

log = logging.getLogger(__name__)
REFRESH_S = 10.0
CONFIG_ACTOR = "config"  # the actor shown for a `--lora` adapter, which no admin registered


class AdapterRegistry:
    """Store plus the name → adapter map the request path reads (no I/O there)."""

    def __init__(self, db: Database, configured: Mapping[str, str]) -> None:
        self.store = AdapterStore(db)
        self.configured = {
            name: AdapterInfo(name, path, None, None, CONFIG_ACTOR) for name, path in configured.items()
        }
        self._by_name: dict[str, AdapterInfo] = dict(self.configured)

    def reload(self) -> list[AdapterInfo]:
        """Read every registered adapter from SQL (blocking; call off the event loop); a `--lora` adapter
        keeps its name (the admin API refuses a taken name, so only a config change could collide)."""
        stored = self.store.list()
        by_name = dict(self.configured)
        for adapter in stored:
            by_name.setdefault(adapter.name, adapter)
        self._by_name = by_name  # one assignment: a request sees the old map or the new one
        return stored

    def visible(self, name: str, tenant_id: str) -> AdapterInfo | None:
        """The adapter `name` if it is public or the tenant's own; None otherwise (unknown or another's)."""
        adapter = self._by_name.get(name)
        if adapter is None or (adapter.tenant_id is not None and adapter.tenant_id != tenant_id):
            return None
        return adapter

    def listed(self, tenant_id: str) -> list[AdapterInfo]:
        """The adapters a key of the tenant may use: the configured ones first, then by registration."""
        return [a for a in self._by_name.values() if a.tenant_id is None or a.tenant_id == tenant_id]

    def all(self) -> list[AdapterInfo]:
        """Every adapter, configured and registered (the admin's view)."""
        return list(self._by_name.values())

    def taken(self, name: str) -> bool:
        """Whether some adapter, any tenant's, already has the name."""
        return name in self._by_name


async def keep_adapters_fresh(registry: AdapterRegistry) -> None:
    """Reload the directory every REFRESH_S seconds until cancelled; a failed read keeps the last one."""
    while True:
        await asyncio.sleep(REFRESH_S)
        try:
            await asyncio.to_thread(registry.reload)
        except Exception:  # a database hiccup: keep serving with the directory we have
            log.warning("could not reload LoRA adapters", exc_info=True)
