"""The gateway's public-prefix registry: the SQL store (billing/prefixes.py) and the in-memory index
every request is matched against (gateway/public_prefixes.py).

The index is reloaded from SQL after each change made here and every `REFRESH_S` seconds by
`keep_prefixes_fresh`, so a change made through one gateway reaches the others (and so every engine:
the match travels in each request's `RequestMeta.public_prefix_tokens`) within that period.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from billing import Database
from billing.prefixes import PrefixInfo, PrefixStore
from gateway.public_prefixes import PublicPrefix, PublicPrefixIndex

log = logging.getLogger(__name__)
REFRESH_S = 10.0


class PrefixRegistry:
    """Store plus index; `match` is the request path's one call (no I/O)."""

    def __init__(self, db: Database) -> None:
        self.store = PrefixStore(db)
        self.index = PublicPrefixIndex()

    def reload(self) -> list[PrefixInfo]:
        """Read every prefix from SQL into the index (blocking; call off the event loop)."""
        prefixes = self.store.list()
        self.index.replace(PublicPrefix(p.model, p.name, p.token_ids) for p in prefixes)
        return prefixes

    def match(self, model: str, prompt_token_ids: Sequence[int]) -> int:
        """Leading prompt tokens inside a registered prefix the prompt starts with (0: none)."""
        return self.index.match(model, prompt_token_ids)


async def keep_prefixes_fresh(registry: PrefixRegistry) -> None:
    """Reload the index every REFRESH_S seconds until cancelled; a failed read keeps the last index."""
    while True:
        await asyncio.sleep(REFRESH_S)
        try:
            await asyncio.to_thread(registry.reload)
        except Exception:  # a database hiccup: keep serving with the index we have
            log.warning("could not reload public prefixes", exc_info=True)
