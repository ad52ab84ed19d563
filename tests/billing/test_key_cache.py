"""KeyCache: the hot path does not hit SQL, revocation takes effect within the TTL, misses are cached."""

from __future__ import annotations

import threading
import time

import pytest

from billing import BillingStore, KeyCache, StoreUnavailable
from billing.keys import generate_secret
from billing.records import ApiKeyInfo, Tenant


class CountingStore:
    """Wraps a BillingStore and counts verify_key calls (i.e. SQL round trips)."""

    def __init__(self, store: BillingStore) -> None:
        self.store = store
        self.calls = 0
        self.fail = False

    def verify_key(self, secret: str) -> tuple[Tenant, ApiKeyInfo] | None:
        self.calls += 1
        if self.fail:
            from sqlalchemy.exc import OperationalError

            raise OperationalError("SELECT", {}, Exception("database is down"))
        return self.store.verify_key(secret)


def _wait_until(predicate, timeout_s: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return bool(predicate())


def test_cached_hits_skip_sql_and_revocation_lands_within_ttl(sqlite_db) -> None:  # type: ignore[no-untyped-def]
    store = BillingStore(sqlite_db)
    store.create_tenant("acme")
    secret, info = store.create_key("acme")
    counting = CountingStore(store)
    ttl = 0.5
    cache = KeyCache(counting, ttl_s=ttl)
    for _ in range(100):
        found = cache.verify(secret)
        assert found is not None and found[1].id == info.id
    assert counting.calls == 1
    store.revoke_key(info.id)
    # Once the entry's TTL has passed the store is asked again and the revocation shows (a generous bound:
    # how soon is the TTL's business, and a loaded machine may be slow to get there).
    assert _wait_until(lambda: cache.verify(secret) is None, timeout_s=ttl + 30.0)
    assert counting.calls >= 2


def test_misses_are_cached_briefly_and_malformed_never_reach_sql(sqlite_db) -> None:  # type: ignore[no-untyped-def]
    counting = CountingStore(BillingStore(sqlite_db))
    cache = KeyCache(counting, ttl_s=5.0, negative_ttl_s=5.0)
    unknown = generate_secret()
    for _ in range(50):
        assert cache.verify(unknown) is None
        assert cache.verify("not-a-key") is None
    assert counting.calls == 1


def test_thread_safe_under_concurrent_verifies(sqlite_db) -> None:  # type: ignore[no-untyped-def]
    store = BillingStore(sqlite_db)
    store.create_tenant("acme")
    secrets = [store.create_key("acme", name=f"k{i}")[0] for i in range(8)]
    cache = KeyCache(store, ttl_s=5.0, max_entries=4)
    errors: list[BaseException] = []

    def hammer(i: int) -> None:
        try:
            for n in range(100):
                assert cache.verify(secrets[(i + n) % len(secrets)]) is not None
        except BaseException as exc:  # noqa: BLE001 - surfaced to the main thread below
            errors.append(exc)

    threads = [threading.Thread(target=hammer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(cache) <= 4


def test_outage_serves_known_keys_stale_and_refuses_unknown(sqlite_db) -> None:  # type: ignore[no-untyped-def]
    store = BillingStore(sqlite_db)
    store.create_tenant("acme")
    secret, _ = store.create_key("acme")
    counting = CountingStore(store)
    cache = KeyCache(counting, ttl_s=0.05, stale_if_error_s=60.0)
    assert cache.verify(secret) is not None
    counting.fail = True
    assert _wait_until(lambda: cache.verify(secret) is not None and counting.calls >= 2, timeout_s=2.0)
    with pytest.raises(StoreUnavailable):
        cache.verify(generate_secret())


def test_unknown_key_flood_cannot_evict_good_keys_and_stays_bounded(sqlite_db) -> None:  # type: ignore[no-untyped-def]
    store = BillingStore(sqlite_db)
    store.create_tenant("acme")
    secret, _ = store.create_key("acme")
    counting = CountingStore(store)
    cache = KeyCache(counting, ttl_s=60.0, max_entries=4, max_negative_entries=50)
    assert cache.verify(secret) is not None
    for _ in range(500):
        assert cache.verify(generate_secret()) is None
    assert len(cache) <= 4 + 50
    calls = counting.calls
    assert cache.peek(secret)[0] and cache.verify(secret) is not None
    assert counting.calls == calls  # the good key was never evicted by the flood


def test_invalidate_tenant_drops_only_that_tenants_keys(sqlite_db) -> None:  # type: ignore[no-untyped-def]
    store = BillingStore(sqlite_db)
    acme, other = store.create_tenant("acme"), store.create_tenant("other")
    a, _ = store.create_key(acme.id)
    b, _ = store.create_key(other.id)
    cache = KeyCache(CountingStore(store), ttl_s=60.0)
    assert cache.verify(a) and cache.verify(b)
    assert cache.invalidate_tenant(acme.id) == 1
    assert cache.peek(a) == (False, None)
    assert cache.peek(b)[1] is not None


def test_every_invalidation_moves_the_generation(sqlite_db) -> None:  # type: ignore[no-untyped-def]
    # The gateway reuses a key peeked before the body was read only while the generation is unchanged.
    store = BillingStore(sqlite_db)
    acme = store.create_tenant("acme")
    a, _ = store.create_key(acme.id)
    cache = KeyCache(CountingStore(store), ttl_s=60.0)
    assert cache.verify(a)
    before = cache.generation
    cache.peek(a)
    assert cache.generation == before  # reading never moves it
    cache.invalidate(a)
    after_one = cache.generation
    cache.invalidate_tenant(acme.id)
    cache.invalidate()
    assert before < after_one < cache.generation
