"""One admission call: deadline, queue bounds and quota together; refusals hold nothing and carry a real peek."""

from __future__ import annotations

import asyncio
import random
import uuid

import pytest
from prometheus_client import CollectorRegistry

from admission.controller import AdmissionController, Rejection
from admission.edge import Admission, AdmissionAsk, EdgeAdmission
from admission.quota import MemoryQuota, QuotaLimits, QuotaStore
from admission.quota_redis import RedisQuota
from tests.admission.stats import Stats
from tests.admission.test_quota import REDIS_URL, _cleanup, require_redis
from tests.defaults import admission_settings

NOW = 1_000.0
LIMITS = QuotaLimits(tokens_per_minute=100)


def _edge(quota: QuotaStore, **bounds: int) -> EdgeAdmission:
    settings = admission_settings(retry_jitter=0.0, **bounds)
    return EdgeAdmission(AdmissionController(settings, random.Random(0)), quota)


def _ask(tokens: int, deadline: float | None = None, limits: QuotaLimits = LIMITS) -> AdmissionAsk:
    return AdmissionAsk(
        "t",
        prompt_tokens=tokens // 2,
        max_tokens=tokens - tokens // 2,
        deadline=deadline,
        arrival=NOW,
        limits=limits,
    )


@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_peek_counts_nothing(backend: str) -> None:
    namespace = f"fairserve-test-{uuid.uuid4().hex}"
    if backend == "redis":
        require_redis()

    async def scenario() -> None:
        quota: QuotaStore = (
            RedisQuota(REDIS_URL, namespace=namespace, registry=CollectorRegistry(), timeout_s=5.0)
            if backend == "redis"
            else MemoryQuota()
        )
        taken = await quota.reserve("t", 30, LIMITS)
        assert taken.allowed
        for _ in range(5):
            seen = await quota.peek("t", LIMITS)
            assert seen.remaining == 70 and seen.limit == 100 and seen.reservation_id is None
            assert seen.policy == "100;w=60" and 59 <= seen.reset_s <= 61.01
        assert (await quota.reserve("t", 70, LIMITS)).allowed  # the peeks took none of the 70 left
        assert (await quota.peek("t", LIMITS)).remaining == 0
        assert (await quota.peek("t", QuotaLimits())).limit is None  # no quota: nothing to look at
        await quota.close()

    try:
        asyncio.run(scenario())
    finally:
        if backend == "redis":
            _cleanup(namespace)


def test_admitted_request_holds_a_slot_and_a_reservation_until_settled() -> None:
    quota = MemoryQuota()
    edge = _edge(quota)

    async def scenario() -> None:
        got = await edge.admit(_ask(60), Stats())
        assert isinstance(got, Admission) and got.quota is not None and got.quota.reservation_id is not None
        assert edge.controller.queues.queued() == 1
        await edge.settle("t", got, 10, LIMITS)  # used 10 of 60: 90 left
        got.slot.release()
        assert (await quota.peek("t", LIMITS)).remaining == 90

    asyncio.run(scenario())


def test_quota_refusal_releases_the_queue_slot_and_names_the_window() -> None:
    edge = _edge(MemoryQuota())

    async def scenario() -> None:
        first = await edge.admit(_ask(80), Stats())
        assert isinstance(first, Admission)
        refused = await edge.admit(_ask(40), Stats())
        assert isinstance(refused, Rejection) and refused.status == 429 and refused.code == "quota_exceeded"
        assert (
            refused.quota is not None and refused.quota.remaining == 20 and refused.retry_after_s is not None
        )
        assert edge.controller.queues.queued() == 1  # only the first request's slot
        assert "reserves 40 tokens" in refused.message and "100 tokens per minute" in refused.message

    asyncio.run(scenario())


def test_a_request_larger_than_the_whole_quota_is_not_retryable() -> None:
    edge = _edge(MemoryQuota())

    async def scenario() -> None:
        refused = await edge.admit(_ask(140), Stats())
        assert isinstance(refused, Rejection)
        assert (refused.status, refused.code, refused.retryable) == (400, "quota_exceeds_limit", False)
        assert refused.retry_after_s is None and refused.param == "max_tokens"
        assert "reserves 140 tokens" in refused.message and "100 tokens per minute" in refused.message
        assert edge.controller.queues.queued() == 0

    asyncio.run(scenario())


def test_deadline_and_queue_refusals_carry_the_quota_state_without_reserving() -> None:
    quota = MemoryQuota()
    edge = _edge(quota, max_queued_requests=1)

    async def scenario() -> None:
        late = await edge.admit(_ask(10, deadline=NOW - 1), Stats())
        assert isinstance(late, Rejection) and late.code == "deadline_passed"
        assert late.quota is not None and late.quota.remaining == 100
        held = await edge.admit(_ask(10), Stats())
        assert isinstance(held, Admission)
        full = await edge.admit(_ask(10), Stats())
        # The same tenant over its share of the full queue: its own doing, a 429.
        assert isinstance(full, Rejection) and full.code == "over_share" and full.quota is not None
        assert full.status == 429
        assert full.quota.remaining == 90  # the refused request reserved nothing
        shed = await edge.shed(Stats(), "t", LIMITS)
        assert shed is not None and shed.quota is not None and shed.quota.remaining == 90
        unmetered = await edge.admit(_ask(10, limits=QuotaLimits()), Stats())
        assert isinstance(unmetered, Rejection) and unmetered.quota is None

    asyncio.run(scenario())


@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_settle_now_settles_a_memory_reservation_and_leaves_redis_to_be_awaited(backend: str) -> None:
    namespace = f"fairserve-test-{uuid.uuid4().hex}"
    if backend == "redis":
        require_redis()

    async def scenario() -> None:
        quota: QuotaStore = (
            RedisQuota(REDIS_URL, namespace=namespace, registry=CollectorRegistry(), timeout_s=5.0)
            if backend == "redis"
            else MemoryQuota()
        )
        edge = _edge(quota)
        got = await edge.admit(_ask(60), Stats())
        assert isinstance(got, Admission) and got.quota is not None
        done = edge.settle_now("t", got, 10)
        assert done is (backend == "memory")  # Redis: the caller must await settle
        if not done:
            await edge.settle("t", got, 10, LIMITS)
        assert (await quota.peek("t", LIMITS)).remaining == 90  # used 10 of 60, either way
        unlimited = await edge.admit(_ask(60, limits=QuotaLimits()), Stats())
        assert isinstance(unlimited, Admission) and edge.settle_now("t", unlimited, 60)  # nothing reserved
        await quota.close()

    try:
        asyncio.run(scenario())
    finally:
        if backend == "redis":
            _cleanup(namespace)
