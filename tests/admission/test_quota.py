"""Sliding-window quotas: exactly-once reservations under concurrency (threads; 8 processes on Redis), settle,
Retry-After, memory and Redis agreeing, and Redis outages failing open or closed without raising."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import random
import socket
import threading
import time
import uuid

import pytest
from prometheus_client import CollectorRegistry

from admission.quota import MemoryQuota, QuotaLimits, make_quota
from admission.quota_redis import RedisQuota
from admission.redis_link import connect
from tests.defaults import REDIS_TIMEOUT_S

REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379
REDIS_URL = f"redis://{REDIS_HOST}:{REDIS_PORT}/0"
QUOTA = 50_000  # tokens per day: nothing leaves the day window during the test
CHUNK = 25
LIMITS = QuotaLimits(tokens_per_minute=10**9, tokens_per_day=QUOTA)


def require_redis() -> None:
    """Fail under CI=true, skip otherwise, when Redis is not listening."""
    try:
        with socket.create_connection((REDIS_HOST, REDIS_PORT), timeout=1.0):
            return
    except OSError:
        pass
    if os.environ.get("CI") == "true":
        pytest.fail(f"Redis at {REDIS_HOST}:{REDIS_PORT} is unreachable (CI=true: backend tests must run)")
    pytest.skip(f"Redis at {REDIS_HOST}:{REDIS_PORT} is unreachable")


class FakeClock:
    """A settable monotonic clock for deterministic window arithmetic."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _hammer(quota: MemoryQuota, tenant: str, start: threading.Event, seconds: float) -> int:
    start.wait()
    admitted = 0
    denied_in_a_row = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and denied_in_a_row < 200:
        decision = quota.reserve_now(tenant, CHUNK, LIMITS)
        if decision.allowed:
            admitted += CHUNK
            denied_in_a_row = 0
        else:
            assert decision.retry_after_s > 0 and decision.reservation_id is None
            denied_in_a_row += 1
    return admitted


def test_memory_threads_admit_exactly_the_quota() -> None:
    quota = MemoryQuota()
    start = threading.Event()
    results: list[int] = []
    threads = [
        threading.Thread(target=lambda: results.append(_hammer(quota, "t", start, 60.0))) for _ in range(8)
    ]
    for t in threads:
        t.start()
    start.set()
    for t in threads:
        t.join()
    assert sum(results) == QUOTA  # a window, not a bucket: nothing refills while it is full


async def _redis_hammer(quota: RedisQuota, tenant: str, seconds: float) -> int:
    admitted = 0
    denied_in_a_row = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and denied_in_a_row < 200:
        decision = await quota.reserve(tenant, CHUNK, LIMITS)
        if decision.allowed:
            admitted += CHUNK
            denied_in_a_row = 0
        else:
            assert decision.reason == "insufficient_tokens", decision
            denied_in_a_row += 1
    await quota.close()
    return admitted


def _redis_worker(namespace: str, ready, start, out) -> None:  # type: ignore[no-untyped-def]
    quota = RedisQuota(REDIS_URL, namespace=namespace, registry=CollectorRegistry(), timeout_s=5.0)
    ready.put(True)  # spawned interpreters start seconds apart on a loaded machine: race only once all are up
    start.wait()
    # Each process stops once the quota is spent (200 refusals in a row); the bound only catches a hang, so a
    # loaded machine that needs longer to spend it does not end the race early.
    out.put(asyncio.run(_redis_hammer(quota, "tenant-a", 90.0)))


def test_redis_eight_processes_admit_exactly_the_quota() -> None:
    require_redis()
    namespace = f"fairserve-test-{uuid.uuid4().hex}"
    ctx = mp.get_context("spawn")
    ready, start, out = ctx.Queue(), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_redis_worker, args=(namespace, ready, start, out)) for _ in range(8)]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=120)
    start.set()
    totals = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    assert all(t > 0 for t in totals), totals  # every process really competed
    assert sum(totals) == QUOTA
    _cleanup(namespace)


def _cleanup(namespace: str) -> None:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    leftovers = list(client.scan_iter(match=f"{namespace}:*", count=1000))
    if leftovers:
        client.delete(*leftovers)
    client.close()


@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_settle_refunds_once_and_retry_after_is_when_tokens_leave_the_window(backend: str) -> None:
    namespace = f"fairserve-test-{uuid.uuid4().hex}"
    if backend == "redis":
        require_redis()

    async def scenario() -> None:
        quota = (
            RedisQuota(REDIS_URL, namespace=namespace, registry=CollectorRegistry(), timeout_s=5.0)
            if backend == "redis"
            else MemoryQuota()
        )
        limits = QuotaLimits(tokens_per_minute=600)
        first = await quota.reserve("t", 500, limits)
        assert first.allowed and first.reservation_id and first.limit == 600 and first.policy == "600;w=60"
        assert first.remaining == 100 and 59 <= first.reset_s <= 61.01
        denied = await quota.reserve("t", 300, limits)
        assert not denied.allowed and denied.reason == "insufficient_tokens" and denied.remaining == 100
        # The 500 tokens leave the window 60-61 s after they were taken; nothing refills before.
        assert 59 <= denied.retry_after_s <= 61.01
        await quota.settle("t", first.reservation_id, 100, limits)  # used 100 of 500: refund 400
        await quota.settle("t", first.reservation_id, 100, limits)  # a second settle must not refund again
        again = await quota.reserve("t", 450, limits)
        assert again.allowed and again.remaining == 50
        assert not (await quota.reserve("t", 100, limits)).allowed  # would be allowed had it refunded twice
        too_big = await quota.reserve("t", 601, limits)
        assert not too_big.allowed and too_big.reason == "exceeds_limit" and too_big.retry_after_s == 60
        other = await quota.reserve("other-tenant", 600, limits)
        assert other.allowed and other.remaining == 0  # tenants are isolated
        # Using more than reserved counts the excess now.
        await quota.settle("other-tenant", other.reservation_id, 650, limits)
        peek = await quota.reserve("other-tenant", 0, limits)
        assert not peek.allowed and peek.remaining == 0 and peek.reservation_id is None  # 650 of 600 counted
        await quota.close()

    try:
        asyncio.run(scenario())
    finally:
        if backend == "redis":
            _cleanup(namespace)


def test_redis_and_memory_agree_on_a_random_sequence() -> None:
    require_redis()
    namespace = f"fairserve-test-{uuid.uuid4().hex}"
    rng = random.Random(7)
    limits = QuotaLimits(tokens_per_minute=2_000, tokens_per_day=3_000)

    async def scenario() -> None:
        redis_q = RedisQuota(REDIS_URL, namespace=namespace, registry=CollectorRegistry(), timeout_s=5.0)
        memory_q = MemoryQuota()
        open_ids: list[tuple[str | None, str | None, int]] = []
        for _ in range(300):
            if open_ids and rng.random() < 0.4:
                rid_r, rid_m, reserved = open_ids.pop(rng.randrange(len(open_ids)))
                actual = rng.randint(0, reserved)
                await redis_q.settle("t", rid_r, actual, limits)
                await memory_q.settle("t", rid_m, actual, limits)
                continue
            tokens = rng.randint(0, 400)
            r, m = await redis_q.reserve("t", tokens, limits), await memory_q.reserve("t", tokens, limits)
            assert (r.allowed, r.remaining, r.limit, r.reason) == (m.allowed, m.remaining, m.limit, m.reason)
            if r.allowed:
                open_ids.append((r.reservation_id, m.reservation_id, tokens))
        await redis_q.close()

    try:
        asyncio.run(scenario())
    finally:
        _cleanup(namespace)


def test_memory_window_slides_with_the_clock() -> None:
    clock = FakeClock()
    quota = MemoryQuota(clock=clock)
    limits = QuotaLimits(tokens_per_minute=60, tokens_per_day=1_000)
    assert quota.reserve_now("t", 60, limits).allowed
    denied = quota.reserve_now("t", 30, limits)
    # Taken in slot 1000 (1 s slots): it counts until the window no longer overlaps that slot, at t = 1061.
    assert not denied.allowed and denied.retry_after_s == pytest.approx(61.0)
    assert denied.policy == "60;w=60, 1000;w=86400"
    clock.now += 30.0  # a bucket would have refilled 30 tokens by now
    assert not quota.reserve_now("t", 1, limits).allowed
    clock.now += 30.9
    assert not quota.reserve_now("t", 1, limits).allowed
    clock.now += 0.1 + 1e-6
    decision = quota.reserve_now("t", 60, limits)
    assert decision.allowed and decision.remaining == 0 and decision.limit == 60
    unlimited = quota.reserve_now("t", 10**9, QuotaLimits())
    assert unlimited.allowed and unlimited.limit is None and unlimited.reservation_id is None


def test_bad_arguments_are_refused() -> None:
    quota = MemoryQuota()
    with pytest.raises(ValueError, match="tokens"):
        quota.reserve_now("t", -1, QuotaLimits(tokens_per_minute=10))
    with pytest.raises(ValueError, match="quotas"):
        quota.reserve_now("t", 1, QuotaLimits(tokens_per_minute=-5))


@pytest.mark.parametrize("fail_open", [True, False])
def test_redis_down_fails_open_or_closed_without_raising(
    fail_open: bool, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    registry = CollectorRegistry()

    async def scenario() -> None:
        link = connect(f"redis://127.0.0.1:{port}/0", REDIS_TIMEOUT_S, registry=registry)
        quota = make_quota(link, fail_open=fail_open, registry=registry)
        assert isinstance(quota, RedisQuota)
        decision = await quota.reserve("t", 10, QuotaLimits(tokens_per_minute=100))
        assert decision.allowed is fail_open and decision.reason == "backend_unavailable"
        if not fail_open:
            assert decision.retry_after_s >= 1
        assert quota.link.breaker.is_open  # the next call fails fast, without touching the socket
        again = await quota.reserve("t", 10, QuotaLimits(tokens_per_minute=100))
        assert again.allowed is fail_open and again.reason == "backend_unavailable"
        await quota.settle("t", "some-reservation", 5, QuotaLimits(tokens_per_minute=100))
        await quota.close()
        await link.close()

    asyncio.run(scenario())
    outcome = "allowed" if fail_open else "denied"
    assert (
        registry.get_sample_value(
            "fairserve_quota_backend_unavailable_total", {"op": "reserve", "outcome": outcome}
        )
        == 2
    )
    assert (
        registry.get_sample_value(
            "fairserve_quota_backend_unavailable_total", {"op": "settle", "outcome": "lost"}
        )
        == 1
    )
    assert "quota backend unavailable" in caplog.text
    assert isinstance(make_quota(None), MemoryQuota)
