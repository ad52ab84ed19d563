"""One fair share across engines: two real LLMEngines (embedded model, CPU) sharing VTC counters via real Redis.

The engines are stepped in turn by the test; each tenant is kept backlogged on the engines its layout
names, and served tokens (prompt + output, prefix caching off) are counted from the engines' outputs.
"""

from __future__ import annotations

import itertools
import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pydantic
import pytest
import redis

from engine import EngineConfig, EngineStats, LLMEngine, RequestMeta, SamplingParams
from engine.worker.loader import LoadedModel, load_model
from fairness import FairnessConfig
from tests.billing.services import REDIS_URL, private_redis, require
from tests.redis_server import RedisServer

Layout = dict[str, float]  # tenant -> weight: the tenants kept backlogged on one engine
PARAMS = SamplingParams(max_tokens=24, ignore_eos=True, temperature=0.0)
QUEUED = 6  # requests each tenant keeps waiting on each of its engines (4 seats)


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    return load_model(None, dtype="auto", device="cpu")


@pytest.fixture()
def shared_redis() -> Iterator[tuple[str, str]]:
    """The machine's Redis and a prefix of this test's own, deleted afterwards."""
    require("127.0.0.1", 6379, "Redis")
    prefix = f"test:counter-sync:{uuid.uuid4().hex}"
    yield REDIS_URL, prefix
    client = redis.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(f"{prefix}:*"))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture()
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    yield from private_redis(tmp_path / "redis")


def make_engine(loaded: LoadedModel, url: str | None, prefix: str = "unused") -> LLMEngine:
    # A 10 ms sync interval: these engines step in a few ms, so the default 100 ms would leave counters
    # ~30 steps stale and the ratio would need many more tokens to settle (test time).
    config = EngineConfig(
        num_kv_blocks=128,
        max_num_seqs=4,
        max_num_batched_tokens=64,
        enable_prefix_caching=False,
        redis_url=url,
        counter_sync_prefix=prefix,
        counter_sync_interval_s=0.01,
        fairness=FairnessConfig(w_in=1.0, w_out=1.0),
    )
    return LLMEngine(config, loaded=loaded)


class Cluster:
    """Engines stepped in turn, each keeping its layout's tenants backlogged."""

    def __init__(
        self, loaded: LoadedModel, layouts: list[Layout], url: str | None, prefix: str = "unused"
    ) -> None:
        self.engines = [make_engine(loaded, url, prefix) for _ in layouts]
        self.layouts = layouts
        self.served: dict[str, int] = defaultdict(int)
        self._tenant: dict[str, str] = {}
        self._ids = itertools.count()

    def step(self) -> None:
        for engine, layout in zip(self.engines, self.layouts, strict=True):
            waiting = engine.stats().waiting_by_tenant
            for tenant, weight in layout.items():
                for _ in range(QUEUED - waiting.get(tenant, 0)):
                    n = next(self._ids)
                    self._tenant[f"r{n}"] = tenant
                    engine.add_request(
                        f"r{n}",
                        [5 + (n + j) % 50 for j in range(8)],
                        PARAMS,
                        RequestMeta(tenant_id=tenant, weight=weight),
                    )
            for out in engine.step():
                first = len(out.token_ids) == len(out.new_token_ids)
                self.served[self._tenant[out.request_id]] += len(out.new_token_ids) + (
                    len(out.prompt_token_ids) if first else 0
                )

    def run(self, tokens: int, max_steps: int = 50_000) -> dict[str, int]:
        """Step until `tokens` more are served; each tenant's part of them."""
        start = dict(self.served)
        goal = sum(start.values()) + tokens
        for _ in range(max_steps):
            if sum(self.served.values()) >= goal:
                return {t: n - start.get(t, 0) for t, n in self.served.items()}
            self.step()
        raise AssertionError(f"{tokens} tokens not served in {max_steps} steps")

    def step_until(self, condition: Callable[[], Any], what: str, timeout: float = 20.0) -> int:
        """Keep stepping until `condition` holds; the tokens served meanwhile. Fails after `timeout` seconds."""
        before = sum(self.served.values())
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}")
            self.step()
        return sum(self.served.values()) - before

    def synced(self) -> bool:
        """Every engine's last exchange succeeded and it sees all the others."""
        return all(
            s.counter_sync == "ok" and s.counter_sync_engines == len(self.engines) - 1
            for s in (e.stats() for e in self.engines)
        )

    def close(self) -> None:
        for engine in self.engines:
            engine.close()


def shares(
    loaded: LoadedModel,
    layouts: list[Layout],
    url: str | None,
    prefix: str = "unused",
    warmup: int = 500,
    tokens: int = 2500,
) -> dict[str, int]:
    """Tokens each tenant was served of `tokens`, after a warm-up in which the counters first meet."""
    cluster = Cluster(loaded, layouts, url, prefix)
    try:
        if url is not None:
            cluster.step_until(cluster.synced, "the engines to see each other")
        cluster.run(warmup)
        return cluster.run(tokens)
    finally:
        cluster.close()


def test_skewed_ingress_gets_one_share_across_engines_only_with_shared_counters(
    loaded: LoadedModel, shared_redis: tuple[str, str]
) -> None:
    """Engine 1 has A and B backlogged, engine 2 only B: shared, A gets all of engine 1 (1:1); alone, 1:3."""
    layouts: list[Layout] = [{"A": 1.0, "B": 1.0}, {"B": 1.0}]
    shared = shares(loaded, layouts, *shared_redis, tokens=9000)  # long enough that the sync lag is noise
    alone = shares(loaded, layouts, None, warmup=0, tokens=1500)
    print(
        f"\n1:1 skewed ingress, A:B served tokens: shared {shared['A'] / shared['B']:.3f} ({shared}), "
        f"alone {alone['A'] / alone['B']:.3f} ({alone})"
    )
    assert shared["A"] / shared["B"] == pytest.approx(1.0, rel=0.10)
    assert alone["A"] / alone["B"] < 0.5  # about 1:3: each engine is fair only to what it sees


def test_weights_four_to_one_hold_across_engines_only_with_shared_counters(
    loaded: LoadedModel, shared_redis: tuple[str, str]
) -> None:
    """A (weight 4) on both engines, B (weight 1) on engine 1 only: shared 4:1; alone A also gets 4/5 of
    engine 1 on top of all of engine 2 (9:1)."""
    layouts: list[Layout] = [{"A": 4.0, "B": 1.0}, {"A": 4.0}]
    # The counters lag by what the other engine serves in one sync interval: a fixed offset in tokens, larger
    # on a fast machine (more steps per interval). Over 9,000 tokens it moves the ratio by under 10%.
    shared = shares(loaded, layouts, *shared_redis, tokens=9000)
    alone = shares(loaded, layouts, None, warmup=0, tokens=1500)
    print(
        f"\n4:1 weights, A:B served tokens: shared {shared['A'] / shared['B']:.3f} ({shared}), "
        f"alone {alone['A'] / alone['B']:.3f} ({alone})"
    )
    assert shared["A"] / shared["B"] == pytest.approx(4.0, rel=0.10)
    assert alone["A"] / alone["B"] > 6.0


def test_engines_step_on_through_a_frozen_and_a_dead_redis_and_resync(
    loaded: LoadedModel, own_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="fairserve.engine.counter_sync")
    cluster = Cluster(loaded, [{"A": 1.0, "B": 1.0}, {"B": 1.0}], own_redis.url, "test:counter-sync")
    one, two = cluster.engines
    try:
        cluster.step_until(cluster.synced, "the engines to see each other")
        cluster.run(200)

        own_redis.freeze()  # connections hang: the sync threads wait on their timeouts, the loops must not
        cluster.step_until(lambda: one.stats().counter_sync == "stale", "a frozen Redis to show as stale")
        assert cluster.run(200)["A"] > 0  # still stepping, on the counters it has
        own_redis.thaw()
        cluster.step_until(cluster.synced, "the sync to recover after a thaw")

        own_redis.kill()
        cluster.step_until(lambda: one.stats().counter_sync == "stale", "a dead Redis to show as stale")
        assert cluster.run(200)["A"] > 0
        assert one.stats().counter_sync == "stale"  # and it stays so while Redis is gone
        served_meanwhile = two.policy.local_service()["0:B"]  # type: ignore[attr-defined]
        own_redis.start()  # empty: the engines republish their cumulative totals
        cluster.step_until(
            lambda: (
                cluster.synced()
                and one.counter_sync.remote_service().get(  # type: ignore[union-attr]
                    "0:B", 0.0
                )
                >= served_meanwhile
            ),
            "engine 1 to learn what engine 2 served while Redis was down",
        )
    finally:
        cluster.close()
    messages = [r.getMessage() for r in caplog.records]
    assert (
        sum("Redis unavailable" in m for m in messages) >= 4
    )  # one line per outage per engine, not per tick
    assert sum("Redis unavailable" in m for m in messages) <= 6
    assert sum("answers again" in m for m in messages) >= 4


def test_redis_url_is_validated_at_the_edge() -> None:
    with pytest.raises(pydantic.ValidationError, match="redis_url"):
        EngineConfig(redis_url="http://127.0.0.1:6379")
    with pytest.raises(pydantic.ValidationError, match="redis_url"):
        EngineConfig(redis_url="redis://127.0.0.1:6379/0", fairness=FairnessConfig(policy="fcfs"))
    with pytest.raises(pydantic.ValidationError, match="counter_sync_interval_s"):
        EngineConfig(counter_sync_interval_s=2.0)
    assert EngineConfig().redis_url is None  # off unless asked: a lone engine behaves as before


def test_sync_state_crosses_the_engine_boundary() -> None:
    stats = EngineStats(counter_sync="stale", counter_sync_age_s=1.5, counter_sync_engines=3)
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(stats), type=EngineStats) == stats
