"""The upstream dispatcher's order, with no HTTP: requests leave the gateway's queue in the order of the
same fairness policy and counters the engine's scheduler uses, deadlines and cancels end queued requests,
and with Redis two gateways in front of one upstream keep one fair share.

The replicas here are never called: `_start` is replaced by a recorder, so what is tested is the queue,
the windows and the charges (upstream/engine.py); the calls are tested over real HTTP elsewhere.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path

import pytest

from engine.core.outputs import RequestOutput
from engine.core.request import FinishReason, RequestMeta
from engine.core.sampling_params import SamplingParams
from engine.core.tokenizer import Tokenizer
from engine.serving.counter_sync import CounterSync
from engine.worker.loader import default_model_dir
from fairness import FairnessConfig
from tests.gateway.conftest import REDIS_URL, redis_available
from upstream import ProbeResult, QueuedPastDeadline, UpstreamEngine, UpstreamSettings
from upstream.pending import Pending
from upstream.replica import Replica

PROMPT = list(range(10, 26))


def on_a_loop(test: Callable[..., Coroutine[None, None, None]]) -> Callable[..., None]:
    """Run an async test body on a fresh event loop (bounded), as the project's other async tests do."""

    @functools.wraps(test)
    def run(*args: object, **kwargs: object) -> None:
        asyncio.run(asyncio.wait_for(test(*args, **kwargs), 60))

    return run


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_dir(default_model_dir())


class Recorder(UpstreamEngine):
    """An UpstreamEngine whose dispatches are recorded instead of called; `complete` ends one."""

    def __init__(self, tokenizer: Tokenizer, window: int, sync: CounterSync | None = None) -> None:
        settings = UpstreamSettings(
            window_min=1, window_max=window, window_start=window, metrics_interval_s=10
        )
        found = ProbeResult("http://127.0.0.1:9", "openai", "m", 4096, None, False)
        super().__init__("m", [found], settings, tokenizer, FairnessConfig(), counter_sync=sync)
        self.started: list[Pending] = []

    def _start(self, pending: Pending, replica: Replica) -> None:
        pending.dispatched_at = time.monotonic()
        pending.charged_service += self.policy.charge(pending, len(pending.prompt_token_ids), 0, 0)
        replica.window.in_flight += 1
        self.started.append(pending)

    def complete(self, pending: Pending, output_tokens: int) -> None:
        self.charge_output(pending, output_tokens)
        self.replicas[0].window.in_flight -= 1
        self.ended(pending)


def meta(tenant: str, weight: float = 1.0, deadline: float | None = None) -> RequestMeta:
    return RequestMeta(tenant_id=tenant, weight=weight, deadline=deadline)


@on_a_loop
async def test_two_backlogged_tenants_of_weights_3_and_1_are_dispatched_3_to_1(tokenizer: Tokenizer) -> None:
    engine = Recorder(tokenizer, window=2)
    engine.start()
    try:
        for i in range(60):
            engine.submit(PROMPT, SamplingParams(max_tokens=50), meta("A", 3.0), f"a{i}")
            engine.submit(PROMPT, SamplingParams(max_tokens=50), meta("B", 1.0), f"b{i}")
        done = 0
        while done < 40:  # each completion frees the window's slot for the policy's next head
            engine.complete(engine.started[done], 50)
            done += 1
        tenants = [p.meta.tenant_id for p in engine.started[:40]]
        assert abs(tenants.count("A") - 30) <= 2, tenants
    finally:
        engine.shutdown()


@on_a_loop
async def test_each_output_token_is_charged_as_it_comes_not_at_the_end(tokenizer: Tokenizer) -> None:
    engine = Recorder(tokenizer, window=1)
    engine.start()
    try:
        engine.submit(PROMPT, SamplingParams(max_tokens=50), meta("A"), "a")
        running = engine.started[0]
        before = engine.policy.service()
        engine.charge_output(running, 7)
        after = engine.policy.service()
        gained = sum(after.values()) - sum(before.values())
        assert gained == pytest.approx(7 * FairnessConfig().w_out)
        assert running.charged_output == 7
        engine.charge_output(running, 0)  # never a charge of 0 recorded as output
        assert running.charged_output == 7
    finally:
        engine.shutdown()


async def _outputs(stream: AsyncIterator[RequestOutput]) -> list[RequestOutput]:
    return [out async for out in stream]


@on_a_loop
async def test_a_deadline_that_passes_in_the_queue_ends_the_request_undispatched(
    tokenizer: Tokenizer,
) -> None:
    engine = Recorder(tokenizer, window=1)
    engine.start()
    try:
        engine.submit(PROMPT, SamplingParams(max_tokens=50), meta("A"), "long")  # holds the only slot
        late = engine.submit(
            PROMPT, SamplingParams(max_tokens=5), meta("B", deadline=time.time() + 0.05), "late"
        )
        with pytest.raises(QueuedPastDeadline) as refused:
            await asyncio.wait_for(_outputs(late), 10)
        assert refused.value.retry_after_s >= 1
        assert [p.request_id for p in engine.started] == ["long"]
        assert "late" not in engine._pending and len(engine.policy) == 0
    finally:
        engine.shutdown()


@on_a_loop
async def test_a_queued_request_cancelled_leaves_the_queue_and_is_never_dispatched(
    tokenizer: Tokenizer,
) -> None:
    engine = Recorder(tokenizer, window=1)
    engine.start()
    try:
        engine.submit(PROMPT, SamplingParams(max_tokens=50), meta("A"), "long")
        queued = engine.submit(PROMPT, SamplingParams(max_tokens=5), meta("B"), "queued")
        assert engine.abort("queued")
        outputs = await asyncio.wait_for(_outputs(queued), 10)
        assert [o.finish_reason for o in outputs] == [FinishReason.CANCELLED]
        assert outputs[-1].metrics.completion_tokens == 0
        engine.complete(engine.started[0], 3)
        assert [p.request_id for p in engine.started] == ["long"]
    finally:
        engine.shutdown()


@on_a_loop
async def test_two_gateways_sharing_redis_keep_one_fair_share(tokenizer: Tokenizer, tmp_path: Path) -> None:
    if not redis_available():
        if os.environ.get("CI") == "true":
            pytest.fail("Redis at 127.0.0.1:6379 is required under CI=true")
        pytest.skip("Redis at 127.0.0.1:6379 is not reachable")
    prefix = f"test-upstream-{uuid.uuid4().hex}"
    syncs = [CounterSync(REDIS_URL, 0.02, prefix) for _ in range(2)]
    first, second = (Recorder(tokenizer, window=1, sync=sync) for sync in syncs)
    first.start()
    second.start()
    try:
        first.submit(PROMPT, SamplingParams(max_tokens=500), meta("A"), "a-elsewhere")
        first.charge_output(first.started[0], 400)  # A was served a lot through the first gateway
        charged = first.policy.local_service()
        while second.counter_sync is not None and second.counter_sync.remote_service() != charged:
            first._kick()  # hands the first gateway's snapshot to its sync thread
            await asyncio.sleep(0.01)  # the sync threads run on their own; the loop must turn meanwhile
        second.submit(PROMPT, SamplingParams(max_tokens=5), meta("C"), "filler")  # holds the one slot
        second.submit(PROMPT, SamplingParams(max_tokens=5), meta("A"), "a")
        second.submit(PROMPT, SamplingParams(max_tokens=5), meta("B"), "b")
        second.complete(second.started[0], 5)
        assert [p.request_id for p in second.started] == ["filler", "b"]
    finally:
        first.shutdown()
        second.shutdown()
