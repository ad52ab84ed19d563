"""In-process TTL cache in front of BillingStore.verify_key, so the request hot path does not hit SQL.

Revocation, a disabled tenant or a changed weight/quota becomes visible within `ttl_s` (default 5 s):
positive answers are cached for at most that long; with Redis configured the gateway also drops entries as
soon as any replica announces a change (gateway/edge/key_events.py), and the TTL is the fallback. Unknown keys are
cached negatively in a separate bounded map for `negative_ttl_s` (default min(ttl_s, 1 s)), so a flood of
distinct bad keys can neither turn into a flood of SQL queries for a repeated key nor evict the good keys.
On a database outage a known key keeps working from its stale entry for up to `stale_if_error_s`; an
unknown one raises StoreUnavailable.
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
        ttl_s: float,
        negative_ttl_s: float | None = None,
        max_entries: int = 10_000,
        stale_if_error_s: float = 60.0,
        max_negative_entries: int = 10_000,
    ) -> None:
        if ttl_s <= 0 or max_entries < 1 or max_negative_entries < 1:
            raise ValueError("ttl_s must be > 0, max_entries and max_negative_entries >= 1")
        self.store = store
        self.ttl_s = ttl_s
        self.negative_ttl_s = min(ttl_s, 1.0) if negative_ttl_s is None else negative_ttl_s
        self.max_entries = max_entries
        self.max_negative_entries = max_negative_entries
        self.stale_if_error_s = stale_if_error_s
        self._entries: OrderedDict[str, tuple[float, Verified]] = OrderedDict()
        self._negative: OrderedDict[str, float] = OrderedDict()  # digest -> expiry
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        # Bumped by every invalidation: an answer peeked under an older generation may be stale.
        self.generation = 0

    def peek(self, secret: str) -> tuple[bool, Verified | None]:
        """(known, answer) from memory only, never SQL: known is False when only the store can tell.

        Malformed secrets are known (None) without a lookup. The event loop calls this; verify() may block.
        """
        if not is_well_formed(secret):
            return True, None
        digest = hash_secret(secret)
        now = time.monotonic()
        with self._lock:
            entry = self._entries.get(digest)
            if entry is not None and entry[0] > now:
                self.hits += 1
                return True, entry[1]
            expiry = self._negative.get(digest)
            if expiry is not None and expiry > now:
                self.hits += 1
                return True, None
        return False, None

    def recently_valid(self, secret: str) -> bool:
        """True when the secret verified as a key before and its (perhaps expired) entry is still held.

        Lets the gateway refresh a paying tenant's expired entry even while its address is over the
        authentication-failure budget: a caller cycling through guessed keys never has such an entry.
        """
        if not is_well_formed(secret):
            return False
        with self._lock:
            return hash_secret(secret) in self._entries

    def verify(self, secret: str) -> Verified | None:
        """The (tenant, key) for a secret, or None for malformed, unknown, revoked or disabled (may query SQL)."""
        known, answer = self.peek(secret)
        if known:
            return answer
        digest = hash_secret(secret)
        now = time.monotonic()
        with self._lock:
            self.misses += 1
            stale = self._entries.get(digest)
        try:
            result = self.store.verify_key(secret)
        except SQLAlchemyError as exc:
            if stale is not None and now - stale[0] < self.stale_if_error_s:
                log.warning("key store unavailable, serving cached key %s: %s", stale[1][1].prefix, exc)
                return stale[1]
            raise StoreUnavailable("API key store unavailable") from exc
        self._remember(digest, result)
        return result

    def _remember(self, digest: str, result: Verified | None) -> None:
        expires = time.monotonic() + (self.ttl_s if result is not None else self.negative_ttl_s)
        with self._lock:
            if result is None:
                self._entries.pop(digest, None)
                self._negative[digest] = expires
                self._negative.move_to_end(digest)
                while len(self._negative) > self.max_negative_entries:
                    self._negative.popitem(last=False)
                return
            self._negative.pop(digest, None)
            self._entries[digest] = (expires, result)
            self._entries.move_to_end(digest)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def invalidate(self, secret: str | None = None) -> None:
        """Forget one secret's entry, or everything (e.g. after revoking through this process)."""
        with self._lock:
            self.generation += 1
            if secret is None:
                self._entries.clear()
                self._negative.clear()
            elif is_well_formed(secret):
                digest = hash_secret(secret)
                self._entries.pop(digest, None)
                self._negative.pop(digest, None)

    def invalidate_tenant(self, tenant_id: str) -> int:
        """Forget every cached key of one tenant (a key revoked, the tenant disabled or changed); returns how many.

        Negative entries do not say whose they were (a disabled tenant's key is cached as unknown), so they
        all go: they are cheap to rebuild and changes are rare.
        """
        with self._lock:
            self.generation += 1
            doomed = [d for d, (_, (tenant, _key)) in self._entries.items() if tenant.id == tenant_id]
            for digest in doomed:
                del self._entries[digest]
            self._negative.clear()
        return len(doomed)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries) + len(self._negative)
