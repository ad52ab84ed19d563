"""Two-level counters across engines: both levels travel through real Redis (engine/serving/counter_sync.py)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from engine.serving.counter_sync import CounterSync
from fairness import FairnessConfig, make_policy
from tests.billing.services import REDIS_URL, require
from tests.fairness.stand_in import Job, Meta


@pytest.fixture()
def prefix() -> Iterator[str]:
    require("127.0.0.1", 6379, "Redis")
    name = f"test:flow-counters:{uuid.uuid4().hex}"
    yield name
    client = redis.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(f"{name}:*"))
    if keys:
        client.delete(*keys)
    client.close()


def exchange_until(pairs: list[tuple[CounterSync, Any]], done: Any, timeout: float = 10.0) -> None:
    """Run each engine's loop-side `exchange` until `done()` (polled, bounded)."""
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "the other engine's service never arrived"
        for sync, policy in pairs:
            sync.exchange(policy)
        time.sleep(0.01)


def test_tenant_and_flow_counters_both_reach_the_other_engine(prefix: str) -> None:
    config = FairnessConfig(key="tenant/user")
    serving, waiting = make_policy(config), make_policy(config)
    item = Job("r1", Meta(tenant_id="acme", user="alice"))
    serving.add(item, 0.0)
    serving.pop(item)
    serving.charge(item, 100, 0, 0)
    one, two = CounterSync(REDIS_URL, 0.02, prefix), CounterSync(REDIS_URL, 0.02, prefix)
    one.start()
    two.start()
    try:
        base = waiting._base(0)  # class 0's two-level VTC
        exchange_until(
            [(one, serving), (two, waiting)], lambda: base.flow_counters().get("acme/alice", 0.0) >= 100.0
        )
        assert base.counters()["acme"] == pytest.approx(100.0)
        assert base.flow_counters()["acme/alice"] == pytest.approx(100.0)
    finally:
        one.close()
        two.close()
