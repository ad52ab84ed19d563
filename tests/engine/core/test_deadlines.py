"""Absolute deadlines: expiry while queued, mid-prefill and while decoding, in the scheduler and the engine."""

from __future__ import annotations

import types

import pytest

from engine.config import EngineConfig
from engine.core.request import FinishReason, RequestMeta
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import SchedulerOutput
from engine.serving.llm_engine import LLMEngine
from sim.simulator import CostModel, SimConfig, SimRequest, SimResult, Simulator

STEP = CostModel(a=1.0, b=0.0, c=0.0)  # one simulated second per iteration


def _run(workload: list[SimRequest], **config: object) -> tuple[Simulator, dict[str, int], SimResult]:
    """Run and note, per request, how many blocks were still held right after the iteration it expired in."""
    held_after: dict[str, int] = {}

    def watch(sim: Simulator, out: SchedulerOutput) -> None:
        for request in out.finished:
            held_after[request.request_id] = len(sim.pool.block_ids(request.request_id))

    sim = Simulator(SimConfig(cost=STEP, num_blocks=64, block_size=4, **config))  # type: ignore[arg-type]
    result = sim.run(workload, on_iteration=watch)
    return sim, held_after, result


def test_a_request_expiring_in_the_queue_leaves_unprefilled() -> None:
    sim, held, result = _run(
        [
            SimRequest("busy", prompt_tokens=4, output_tokens=10),
            SimRequest("late", arrival=0.5, prompt_tokens=4, output_tokens=10, deadline=3.0),
        ],
        max_num_seqs=1,
    )
    late = result.completions["late"]
    assert late.reason is FinishReason.DEADLINE and late.finished == 3.0
    assert late.first_scheduled is None and late.output_tokens == 0
    assert result.completions["busy"].output_tokens == 10
    assert sim.scheduler.deadline_misses == {"waiting": 1, "running": 0}
    assert sim.scheduler.deadline_wasted_tokens == 0
    assert held == {"late": 0}


def test_a_request_expiring_mid_prefill_stops_and_frees_its_blocks() -> None:
    sim = Simulator(SimConfig(cost=STEP, num_blocks=64, block_size=4, max_num_batched_tokens=16))
    result = sim.run([SimRequest("long", prompt_tokens=200, output_tokens=5, deadline=5.0)])
    done = result.completions["long"]
    assert done.reason is FinishReason.DEADLINE and done.output_tokens == 0
    assert done.finished == 5.0
    assert result.deadline_misses == {"waiting": 0, "running": 1}
    assert result.deadline_wasted_tokens == 5 * 16  # five 16-token chunks computed for nothing
    assert sim.pool.num_free == sim.pool.num_blocks


def test_a_decoding_request_stops_at_its_deadline_with_its_partial_output() -> None:
    sim, held, _ = _run(
        [
            SimRequest("chat", prompt_tokens=4, output_tokens=100, deadline=10.0),
            SimRequest("other", prompt_tokens=4, output_tokens=30),
        ]
    )
    assert held["chat"] == 0, "blocks must be freed in the iteration the deadline passed"
    assert sim.scheduler.deadline_misses == {"waiting": 0, "running": 1}
    assert sim.scheduler.deadline_wasted_tokens == 4 + 9


def test_partial_output_is_kept_in_the_completion() -> None:
    result = Simulator(SimConfig(cost=STEP)).run(
        [SimRequest("chat", prompt_tokens=4, output_tokens=100, deadline=10.0)]
    )
    done = result.completions["chat"]
    assert done.reason is FinishReason.DEADLINE and done.output_tokens == 10


@pytest.fixture(scope="module")
def engine() -> LLMEngine:
    """A real engine with the embedded default model."""
    return LLMEngine(EngineConfig(num_kv_blocks=64, block_size=4))


def test_engine_expires_queued_and_decoding_requests(
    engine: LLMEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1000.0]
    monkeypatch.setattr("engine.serving.llm_engine.time", types.SimpleNamespace(time=lambda: clock[0]))
    params = SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True)
    engine.add_request("decoding", "a deadline", params, RequestMeta(deadline=1010.0))
    outputs = {o.request_id: o for o in engine.step() + engine.step() + engine.step()}
    assert len(outputs["decoding"].token_ids) == 3
    engine.add_request("queued", "too late", params, RequestMeta(deadline=1005.0))
    clock[0] = 1006.0
    finished = {o.request_id: o for o in engine.step() if o.finished}
    assert finished["queued"].finish_reason is FinishReason.DEADLINE and finished["queued"].token_ids == []
    clock[0] = 1010.0
    finished = {o.request_id: o for o in engine.step() if o.finished}
    out = finished["decoding"]
    assert out.finish_reason is FinishReason.DEADLINE
    assert 3 <= len(out.token_ids) < 50 and out.text
    assert engine.stats().deadline_misses == 2
    assert engine.pool.num_free == engine.pool.num_blocks and not engine.has_unfinished()
