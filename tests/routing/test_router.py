"""EngineRouter over two real in-process engines on the embedded model: affinity, load, health, membership."""

from __future__ import annotations

import asyncio
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from engine import (
    AsyncEngine,
    EngineConfig,
    EngineDeadError,
    FinishReason,
    LLMEngine,
    RequestMeta,
    SamplingParams,
)
from engine.core.outputs import RequestOutput
from engine.serving.boundary.client import EngineClient
from engine.serving.boundary.front import OutputStream
from engine.worker.loader import LoadedModel, load_model
from routing import EngineRouter, RoutingSettings, engine_loads

PREFIX = list(range(10, 74))  # 64 tokens: four full blocks of 16


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    return load_model(None, dtype="auto", device="cpu")


@pytest.fixture()
def engines(loaded: LoadedModel) -> Iterator[dict[str, AsyncEngine]]:
    """Two started engines with four seats each; shut down after the test."""
    cfg = EngineConfig(max_num_seqs=4, num_kv_blocks=128, max_num_batched_tokens=64)
    built = {f"e{i}": AsyncEngine(cfg, engine=LLMEngine(cfg, loaded=loaded)) for i in range(2)}
    for engine in built.values():
        engine.start()
    yield built
    for engine in built.values():
        engine.shutdown()


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


async def until(condition: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> None:
    """Wait for a condition with a bounded deadline (polling, yielding to the loop between looks)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.005)


async def drain(stream: OutputStream) -> RequestOutput:
    last = None
    async for out in stream:
        last = out
    assert last is not None and last.finished
    return last


async def complete(
    router: EngineRouter, prompt: list[int], tenant: str, rid: str
) -> tuple[str, RequestOutput]:
    """Run one request to its end: the engine it was routed to, and its last output."""
    stream = router.submit(prompt, greedy(2), RequestMeta(tenant_id=tenant), rid)
    key = router.engine_of(rid)
    assert key is not None
    last = await drain(stream)
    assert router.engine_of(rid) is None  # forgotten once it ended
    return key, last


def test_the_router_is_an_engine_client(engines: dict[str, AsyncEngine]) -> None:
    router: EngineClient = EngineRouter(engines)  # mypy checks the protocol; this checks what it names
    assert router.model_name == engines["e0"].model_name and router.is_alive
    assert router.max_model_len == engines["e0"].max_model_len and router.caps == engines["e0"].caps
    stats = router.stats()
    assert stats.alive and stats.kv_blocks_total == 256 and stats.max_num_seqs == 8


def test_affinity_keeps_a_tenants_prefix_on_its_engine_and_never_pulls_another_tenant(
    engines: dict[str, AsyncEngine],
) -> None:
    router = EngineRouter(engines)

    async def scenario() -> None:
        home, first = await complete(router, PREFIX + [1, 2, 3], "a", "a1")
        other = next(k for k in engines if k != home)
        # Some load on A's engine (not through the router): affinity outweighs it, a prefix-less choice would not.
        hog = engines[home].submit([5, 6, 7], greedy(1500), RequestMeta(tenant_id="c"), "hog")
        await until(lambda: engines[home].stats().running >= 1, what="the hog to run")
        key, second = await complete(router, PREFIX + [4, 5, 6], "a", "a2")
        assert key == home
        assert second.metrics.cached_tokens >= len(PREFIX)  # the point of it: A's blocks were there
        # Tenant B's prompt is A's first one, token for token: A's digests mean nothing for B.
        key_b, b = await complete(router, PREFIX + [1, 2, 3], "b", "b1")
        assert key_b == other and b.metrics.cached_tokens == 0
        hog.close()

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_a_registered_prompt_is_spread_by_load_not_pinned(engines: dict[str, AsyncEngine]) -> None:
    """The same tenant's prompt that pins it home while private goes to the idle engine once public."""
    router = EngineRouter(engines)

    async def scenario() -> None:
        public = RequestMeta(tenant_id="a", public_prefix_tokens=len(PREFIX))
        first = router.submit(PREFIX + [1, 2, 3], greedy(2), public, "p1")
        home = router.engine_of("p1")
        assert home is not None
        await drain(first)
        other = next(k for k in engines if k != home)
        hog = engines[home].submit([5, 6, 7], greedy(1500), RequestMeta(tenant_id="c"), "hog")
        await until(lambda: engines[home].stats().running >= 1, what="the hog to run")
        public = RequestMeta(tenant_id="a", public_prefix_tokens=len(PREFIX))
        second = router.submit(PREFIX + [4, 5, 6], greedy(2), public, "p2")
        assert router.engine_of("p2") == other  # load decides: the public blocks pull nowhere
        await drain(second)
        hog.close()

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_a_burst_spreads_before_any_engine_reports_it(engines: dict[str, AsyncEngine]) -> None:
    """Eight equal prompts of eight tenants submitted in one go: the router counts what it sent."""
    router = EngineRouter(engines)

    async def scenario() -> None:
        # Behind a worker process or a remote engine no stats can arrive while the event loop is busy
        # submitting; a long GIL switch interval makes the thread engines just as silent for the burst.
        interval = sys.getswitchinterval()
        sys.setswitchinterval(5.0)
        try:
            streams = [
                router.submit(PREFIX, greedy(3), RequestMeta(tenant_id=f"t{i}"), f"r{i}") for i in range(8)
            ]
        finally:
            sys.setswitchinterval(interval)
        assert Counter(router.engine_of(f"r{i}") for i in range(8)) == {"e0": 4, "e1": 4}
        loads = {load.key: load for load in router.engine_loads()}
        assert loads["e0"].in_flight == loads["e0"].routed == 4
        for stream in streams:
            await drain(stream)
        assert all(load.in_flight == 0 for load in router.engine_loads())

    asyncio.run(asyncio.wait_for(scenario(), 60))


@pytest.mark.parametrize(("affinity_weight", "spreads"), [(0.5, True), (100.0, False)])
def test_load_outweighs_a_tenants_affinity_unless_told_otherwise(
    engines: dict[str, AsyncEngine], affinity_weight: float, spreads: bool
) -> None:
    """One tenant, one shared prefix, a burst: the default weight lets its queue spill to the idle engine."""
    router = EngineRouter(engines, RoutingSettings(affinity_weight=affinity_weight))

    async def scenario() -> None:
        streams = [
            router.submit(PREFIX + [i + 1], greedy(3), RequestMeta(tenant_id="a"), f"a{i}") for i in range(8)
        ]
        placed = Counter(router.engine_of(f"a{i}") for i in range(8))
        for stream in streams:
            await drain(stream)
        if spreads:
            assert min(placed.values()) >= 2 and len(placed) == 2, placed
        else:
            assert len(placed) == 1, placed

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_a_dead_engine_is_skipped_at_once_and_none_alive_is_engine_dead(
    engines: dict[str, AsyncEngine],
) -> None:
    router = EngineRouter(engines)
    engines["e0"].shutdown()

    async def scenario() -> None:
        for i in range(4):
            key, last = await complete(router, [1, 2, 3], f"t{i}", f"r{i}")
            assert key == "e1" and last.finish_reason is FinishReason.LENGTH
        assert router.is_alive and [load.alive for load in router.engine_loads()] == [False, True]
        engines["e1"].shutdown()
        assert not router.is_alive and not router.stats().alive
        with pytest.raises(EngineDeadError):
            router.submit([1, 2, 3], greedy(2), RequestMeta(), "late")
        assert router.engine_of("late") is None

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_abort_live_request_and_task_cancel_reach_the_serving_engine(engines: dict[str, AsyncEngine]) -> None:
    router = EngineRouter(engines)

    async def scenario() -> None:
        x = router.submit([1, 2, 3], greedy(40), RequestMeta(tenant_id="x", task_id="T"), "x")
        y = router.submit([1, 2, 3], greedy(400), RequestMeta(tenant_id="y", task_id="T"), "y")
        assert {router.engine_of("x"), router.engine_of("y")} == {"e0", "e1"}
        info = router.live_request("y")
        assert info is not None and info.tenant_id == "y"
        await until(lambda: engines[str(router.engine_of("y"))].stats().running >= 1, what="y to run")
        assert router.abort("y")
        assert (await drain(y)).finish_reason is FinishReason.CANCELLED
        done = await drain(x)
        assert done.finish_reason is FinishReason.LENGTH and len(done.token_ids) == 40  # x untouched
        assert router.live_request("y") is None and not router.abort("y")
        # A task's requests on both engines are cancelled by one call.
        streams = [
            router.submit([1, 2], greedy(400), RequestMeta(tenant_id=f"t{i}", task_id="U"), f"u{i}")
            for i in range(2)
        ]
        assert sorted(router.cancel_task("U")) == ["u0", "u1"]
        assert [(await drain(s)).finish_reason for s in streams] == [FinishReason.CANCELLED] * 2

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_generate_yields_to_the_end_and_closing_it_early_cancels_on_the_serving_engine(
    engines: dict[str, AsyncEngine],
) -> None:
    """The router's `generate` is the fronts' own over the router's `submit`: routed, read to the finished
    output, and a consumer that leaves early cancels the request where it runs (not after its last token)."""
    router = EngineRouter(engines)

    async def scenario() -> None:
        outs = [out async for out in router.generate([1, 2, 3], greedy(3), RequestMeta(tenant_id="g"), "g1")]
        assert outs[-1].finished and len(outs[-1].token_ids) == 3
        assert router.engine_of("g1") is None
        long = greedy(router.max_model_len - 3)  # far more steps than the engine runs before the abort lands
        gen = router.generate([1, 2, 3], long, RequestMeta(tenant_id="g"), "g2")
        assert not (await anext(gen)).finished
        key = router.engine_of("g2")
        assert key is not None
        before = engines[key].stats().iterations
        await gen.aclose()
        assert router.engine_of("g2") is None and router.live_request("g2") is None
        await until(lambda: engines[key].stats().running == 0, what="the engine to drop g2")
        assert engines[key].stats().iterations - before < long.max_tokens

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_removing_an_engine_lets_its_requests_finish_and_shutting_it_fails_them_cleanly(
    engines: dict[str, AsyncEngine],
) -> None:
    router = EngineRouter(engines)

    async def scenario() -> None:
        streams = {
            f"r{i}": router.submit(
                [1, 2, 3], greedy(30 + 370 * (i % 2)), RequestMeta(tenant_id=f"t{i}"), f"r{i}"
            )
            for i in range(4)
        }
        on_e0 = sorted(rid for rid in streams if router.engine_of(rid) == "e0")
        assert len(on_e0) == 2
        assert router.remove_engine("e0") is engines["e0"] and router.keys() == ["e1"]
        assert [(load.key, load.leaving) for load in router.engine_loads()] == [("e1", False), ("e0", True)]
        key, _ = await complete(router, [9, 9, 9], "new", "new")
        assert key == "e1"
        short, long_ = on_e0  # r0 (30 tokens) and r1 (400): aborting r1 still reaches the leaving engine
        assert router.abort(long_)
        assert (await drain(streams[long_])).finish_reason is FinishReason.CANCELLED
        finished = await drain(streams[short])
        assert finished.finish_reason is FinishReason.LENGTH and len(finished.token_ids) == 30
        assert [load.key for load in router.engine_loads()] == ["e1"]  # gone once its last request ended
        # Removing the last engine and shutting it ends its requests (as that engine ends them), no hang.
        survivor = next(rid for rid in ("r1", "r3") if router.engine_of(rid) == "e1")
        assert router.remove_engine("e1") is engines["e1"] and not router.is_alive
        await asyncio.to_thread(engines["e1"].shutdown)
        try:  # the engine's way to end them: cancelled ("shutdown"), or failed as engine-dead (a retryable 503)
            ended: object = (await drain(streams[survivor])).finish_reason
        except EngineDeadError:
            ended = "engine dead"
        assert ended in (FinishReason.CANCELLED, "engine dead")
        with pytest.raises(EngineDeadError):
            router.submit([1], greedy(1), RequestMeta(), "none")

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_weights_reach_engines_added_later_and_a_foreign_model_is_refused(
    loaded: LoadedModel, engines: dict[str, AsyncEngine]
) -> None:
    router = EngineRouter({"e0": engines["e0"]})
    router.set_tenant_weight("heavy", 3.0, 2)
    router.add_engine("e1", engines["e1"])
    with pytest.raises(ValueError, match="already"):
        router.add_engine("e1", engines["e1"])
    cfg = EngineConfig(num_kv_blocks=64)
    foreign = AsyncEngine(cfg, engine=LLMEngine(cfg, loaded=loaded))
    foreign.model_name = "another-model"
    with pytest.raises(ValueError, match="another-model"):
        router.add_engine("e2", foreign)
    assert router.keys() == ["e0", "e1"]
    router.remove_engine("e0")

    async def scenario() -> None:
        key, _ = await complete(router, [1, 2], "heavy", "h")  # applied before this request, in inbox order
        assert key == "e1"

    asyncio.run(asyncio.wait_for(scenario(), 60))
    assert engines["e1"].engine.policy._weights["heavy"] == 3.0  # type: ignore[attr-defined]


def test_a_lone_engine_shows_as_one_load(engines: dict[str, AsyncEngine]) -> None:
    [load] = engine_loads(engines["e0"])
    assert load.key == "local" and load.alive and load.routed is None and load.kv_blocks_total == 128
    assert [entry.key for entry in engine_loads(EngineRouter(engines))] == ["e0", "e1"]


def test_an_engine_that_returns_gets_the_weights_it_missed_and_no_stale_affinity(
    engines: dict[str, AsyncEngine],
) -> None:
    router = EngineRouter(engines)

    async def scenario() -> None:
        home, _ = await complete(router, PREFIX + [1], "a", "a1")
        assert home == "e0"  # both idle: the first engine
        engines["e0"].shutdown()
        router.set_tenant_weight("heavy", 3.0)  # e0 is down: it cannot hear this
        assert (await complete(router, PREFIX + [2], "a", "a2"))[0] == "e1"
        engines["e0"].start()  # back, with an empty cache
        # e1 now holds A's prefix and e0's memory of it was dropped at the death: A goes to e1, not to
        # e0 by the tie-break a stale memory would win.
        assert (await complete(router, PREFIX + [3], "a", "a3"))[0] == "e1"
        assert (await complete(router, [7, 7, 7], "heavy", "h"))[0] == "e0"

    asyncio.run(asyncio.wait_for(scenario(), 60))
    assert engines["e0"].engine.policy._weights["heavy"] == 3.0  # type: ignore[attr-defined]
