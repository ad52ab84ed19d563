"""In-process TTL cache in front of BillingStore.verify_key, so the request hot path does not hit SQL.

Revocation, a disabled tenant or a changed weight/quota becomes visible within `ttl_s` (default 5 s):
positive and negative answers are both cached for at most that long. On a database outage a known
key keeps working from its stale entry for up to `stale_if_error_s`; an unknown one raises StoreUnavailable.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from typing import Protocol

from sqlalchemy.exc import SQLAlchemyError

from billing.errors import StoreUnavailable
from billing.keys import hash_secret, is_well_formed
from billing.records import ApiKeyInfo, Tenant

log = logging.getLogger(__name__)

Verified = tuple[Tenant, ApiKeyInfo]


class KeyVerifier(Protocol):
    """Anything that can verify a secret against the store (BillingStore in production)."""

    def verify_key(self, secret: str) -> Verified | None: ...


class KeyCache:
    """Thread-safe TTL cache of key verifications, keyed by the sha256 of the secret (never the secret)."""

    def __init__(
        self,
        store: KeyVerifier,
        ttl_s: float = 5.0,
        negative_ttl_s: float | None = None,
        max_entries: int = 10_000,
        stale_if_error_s: float = 60.0,
    ) -> None:
        if ttl_s <= 0 or max_entries < 1:
            raise ValueError("ttl_s must be > 0 and max_entries >= 1")
        self.store = store
        self.ttl_s = ttl_s
        # Misses are cached briefly so a flood of bad keys cannot turn into a flood of SQL queries.
        self.negative_ttl_s = min(ttl_s, 1.0) if negative_ttl_s is None else negative_ttl_s
        self.max_entries = max_entries
        self.stale_if_error_s = stale_if_error_s
        self._entries: OrderedDict[str, tuple[float, Verified | None]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def verify(self, secret: str) -> Verified | None:
        """The (tenant, key) for a secret, or None for malformed, unknown, revoked or disabled."""
        if not is_well_formed(secret):
            return None
        digest = hash_secret(secret)
        now = time.monotonic()
        with self._lock:
            entry = self._entries.get(digest)
            if entry is not None and entry[0] > now:
                self.hits += 1
                return entry[1]
            self.misses += 1
        try:
            result = self.store.verify_key(secret)
        except SQLAlchemyError as exc:
            if entry is not None and entry[1] is not None and now - entry[0] < self.stale_if_error_s:
                log.warning("key store unavailable, serving cached key %s: %s", entry[1][1].prefix, exc)
                return entry[1]
            raise StoreUnavailable("API key store unavailable") from exc
        ttl = self.ttl_s if result is not None else self.negative_ttl_s
        with self._lock:
            self._entries[digest] = (time.monotonic() + ttl, result)
            self._entries.move_to_end(digest)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
        return result

    def invalidate(self, secret: str | None = None) -> None:
        """Forget one secret's entry, or everything (e.g. after revoking through this process)."""
        with self._lock:
            if secret is None:
                self._entries.clear()
            elif is_well_formed(secret):
                self._entries.pop(hash_secret(secret), None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
