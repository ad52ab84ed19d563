"""Async scheduling (engine/core/async_scheduler.py): the same tokens, text, finish reasons and charges as the plain loop."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from engine import (
    EngineConfig,
    FinishReason,
    LLMEngine,
    ProcessEngine,
    RequestMeta,
    RequestOutput,
    SamplingParams,
)
from engine.core.request import RequestState
from engine.worker.loader import LoadedModel, load_model

PROMPTS = [
    [(7 * i + j) % 250 + 1 for j in range(20 + 9 * i)] for i in range(6)
]  # 20-65 tokens, no shared prefix


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    return load_model(None, dtype="auto", device="cpu")


@dataclass
class Run:
    """What one engine run produced, per request, and what the policy charged."""

    tokens: dict[str, list[int]] = field(default_factory=dict)
    text: dict[str, str] = field(default_factory=dict)
    reasons: dict[str, FinishReason | None] = field(default_factory=dict)
    charged: dict[str, float] = field(default_factory=dict)
    service: dict[str, float] = field(default_factory=dict)
    preemptions: int = 0
    discarded: int = 0
    overlapped: int = 0  # steps scheduled while the step before was still on the forward thread


def run(
    loaded: LoadedModel,
    overlap: bool,
    params: list[SamplingParams],
    abort_at: dict[str, int] | None = None,
    **config: object,
) -> Run:
    """Serve PROMPTS with `params` to the end; abort a request once it has streamed `abort_at` tokens."""
    cfg = EngineConfig(
        **{
            "num_kv_blocks": 64,
            "max_num_batched_tokens": 16,
            "max_num_seqs": 6,  # type: ignore[arg-type]
            "async_scheduling": "on" if overlap else "off",
            **config,
        }
    )
    engine = LLMEngine(cfg, loaded=loaded)
    result = Run()
    for i, (prompt, p) in enumerate(zip(PROMPTS, params, strict=True)):
        engine.add_request(f"r{i}", prompt, p, RequestMeta(tenant_id=f"t{i % 3}"))
        result.tokens[f"r{i}"], result.text[f"r{i}"] = [], ""
    abort_at = dict(abort_at or {})
    for _ in range(2000):
        if not engine.has_unfinished():
            break
        for out in engine.step_deltas():
            result.tokens[out.request_id] += out.new_token_ids
            result.text[out.request_id] += out.delta_text
            assert all(t >= 0 for t in out.new_token_ids)  # never a placeholder
            if out.finished:
                result.reasons[out.request_id] = out.finish_reason
                result.charged[out.request_id] = out.metrics.charged_service
            if (
                abort_at.get(out.request_id, -1) != -1
                and len(result.tokens[out.request_id]) >= abort_at[out.request_id]
            ):
                engine.abort_request(out.request_id)
                abort_at[out.request_id] = -1
        result.discarded += engine.traces[-1].discarded_tokens
        # The trace is of the step that landed; one scheduled after it may be on the forward thread.
        result.overlapped += (
            engine.executor.in_flight and engine.scheduler.iteration > engine.traces[-1].iteration
        )
    else:
        raise AssertionError("the engine never finished")
    assert engine.pool.num_used == 0 and not engine.scheduler.requests
    result.service = dict(engine.policy.service())
    result.preemptions = engine.scheduler.preemptions_total
    engine.close()
    return result


def assert_same(plain: Run, overlapped: Run) -> None:
    assert overlapped.tokens == plain.tokens
    assert overlapped.text == plain.text
    assert overlapped.reasons == plain.reasons
    assert overlapped.charged == plain.charged  # per request: what its ledger row carries
    assert overlapped.service == plain.service  # per tenant: what the policy was charged


GREEDY = [SamplingParams(max_tokens=10 + 3 * i, temperature=0.0, ignore_eos=True) for i in range(6)]


def test_chunked_prefill_and_max_tokens_match(loaded: LoadedModel) -> None:
    plain, overlapped = run(loaded, False, GREEDY), run(loaded, True, GREEDY)
    assert_same(plain, overlapped)
    assert set(plain.reasons.values()) == {FinishReason.LENGTH}
    assert plain.overlapped == 0 and overlapped.overlapped > 0  # steps were scheduled beside a forward


def test_preemption_under_a_small_kv_pool_matches(loaded: LoadedModel) -> None:
    # The step's budget in new tokens only (engine/core/step_cost.py), here and in the swap test: 6 seats must
    # fill 16 blocks for preemptions to happen, and the device's step cost admits fewer prompts at once.
    plain = run(
        loaded, False, GREEDY, num_kv_blocks=16, block_size=8, step_cost_context=0.0, step_cost_sequence=0.0
    )
    overlapped = run(
        loaded, True, GREEDY, num_kv_blocks=16, block_size=8, step_cost_context=0.0, step_cost_sequence=0.0
    )
    assert plain.preemptions > 0 and overlapped.preemptions > 0
    assert_same(plain, overlapped)


PENALIZED = [
    SamplingParams(
        max_tokens=12 + 3 * i,
        temperature=0.0,
        ignore_eos=True,
        repetition_penalty=1.5,
        frequency_penalty=0.5 * (i % 3),
        presence_penalty=0.3,
    )
    for i in range(6)
]


def test_penalties_count_the_same_tokens_with_a_token_in_flight(loaded: LoadedModel) -> None:
    """The sampler counts each request's own sampled tokens, not its list (whose last id is a placeholder
    while its token is in flight): the same tokens as the plain loop, under preemption too, and not the
    unpenalised ones."""
    plain = run(loaded, False, PENALIZED, num_kv_blocks=16, block_size=8)
    overlapped = run(loaded, True, PENALIZED, num_kv_blocks=16, block_size=8)
    assert plain.preemptions > 0 and overlapped.overlapped > 0
    assert_same(plain, overlapped)
    unpenalized = run(
        loaded,
        False,
        [SamplingParams(max_tokens=p.max_tokens, temperature=0.0, ignore_eos=True) for p in PENALIZED],
    )
    assert unpenalized.tokens != plain.tokens


def test_swap_preemption_matches(loaded: LoadedModel) -> None:
    plain = run(
        loaded,
        False,
        GREEDY,
        num_kv_blocks=16,
        block_size=8,
        preemption_mode="swap",
        step_cost_context=0.0,
        step_cost_sequence=0.0,
    )
    overlapped = run(
        loaded,
        True,
        GREEDY,
        num_kv_blocks=16,
        block_size=8,
        preemption_mode="swap",
        step_cost_context=0.0,
        step_cost_sequence=0.0,
    )
    assert plain.preemptions > 0 and overlapped.preemptions > 0
    assert_same(plain, overlapped)


def test_stop_strings_and_tokens_end_early_and_the_speculative_step_is_not_charged(
    loaded: LoadedModel,
) -> None:
    # Find what the model says, then stop on a piece of it: a stop string for some, a stop token for others.
    probe = run(loaded, False, GREEDY)
    params = []
    for i, p in enumerate(GREEDY):
        tokens, text = probe.tokens[f"r{i}"], probe.text[f"r{i}"]
        if i % 2 and len(text) > 8:
            params.append(
                SamplingParams(max_tokens=p.max_tokens, temperature=0.0, ignore_eos=True, stop=[text[5:8]])
            )
        else:
            params.append(
                SamplingParams(
                    max_tokens=p.max_tokens, temperature=0.0, ignore_eos=True, stop_token_ids=[tokens[6]]
                )
            )
    plain, overlapped = run(loaded, False, params), run(loaded, True, params)
    assert_same(plain, overlapped)
    assert all(r is FinishReason.STOP for r in plain.reasons.values())
    assert overlapped.discarded > 0  # speculative decodes were computed for requests that had ended


def test_cancellation_mid_stream_matches(loaded: LoadedModel) -> None:
    aborts = {"r1": 3, "r4": 7}
    plain = run(loaded, False, GREEDY, abort_at=aborts)
    overlapped = run(loaded, True, GREEDY, abort_at=aborts)
    assert plain.reasons["r1"] is plain.reasons["r4"] is FinishReason.CANCELLED
    # Where a cancelled stream stops is a matter of timing (the token in flight still goes out): the tokens it
    # did get are the same, and it was charged for exactly those.
    for rid in aborts:
        n = min(len(plain.tokens[rid]), len(overlapped.tokens[rid]))
        assert overlapped.tokens[rid][:n] == plain.tokens[rid][:n] and n >= aborts[rid]
        assert overlapped.reasons[rid] is FinishReason.CANCELLED
    for rid in plain.tokens.keys() - aborts.keys():
        assert overlapped.tokens[rid] == plain.tokens[rid] and overlapped.charged[rid] == plain.charged[rid]


def test_auto_is_on_for_cuda_only() -> None:
    assert not EngineConfig().overlaps() and EngineConfig(async_scheduling="on").overlaps()
    assert not EngineConfig(async_scheduling="off").overlaps()


def test_an_abort_while_the_token_is_in_flight_still_delivers_it(loaded: LoadedModel) -> None:
    engine = LLMEngine(EngineConfig(num_kv_blocks=64, async_scheduling="on"), loaded=loaded)
    engine.add_request("a", PROMPTS[0], SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True))
    got: list[int] = []
    while len(got) < 3:
        got += [t for d in engine.step_deltas() for t in d.new_token_ids]
    request = engine.scheduler.requests["a"]
    # Its next token is being sampled by the forward in flight (committed at the next schedule).
    assert engine.executor.in_flight and request.state is RequestState.RUNNING
    engine.abort_request("a")
    last = engine.step_deltas()
    assert [d.finish_reason for d in last] == [FinishReason.CANCELLED] and len(last[0].new_token_ids) == 1
    assert last[0].metrics.completion_tokens == len(got) + 1
    assert not engine.has_unfinished() and engine.pool.num_used == 0
    engine.close()


def test_a_worker_process_with_async_scheduling_streams_the_same(loaded: LoadedModel) -> None:
    plain = run(loaded, False, GREEDY)
    engine = ProcessEngine(
        EngineConfig(num_kv_blocks=64, max_num_batched_tokens=16, max_num_seqs=6, async_scheduling="on")
    )
    engine.start()
    try:

        async def one(i: int) -> RequestOutput:
            last = None
            async for out in engine.generate(
                PROMPTS[i], GREEDY[i], RequestMeta(tenant_id=f"t{i % 3}"), f"r{i}"
            ):
                last = out
            assert last is not None
            return last

        async def all_of() -> list[RequestOutput]:
            return await asyncio.gather(*(one(i) for i in range(len(PROMPTS))))

        finals = asyncio.run(all_of())
    finally:
        engine.shutdown()
    for i, out in enumerate(finals):
        assert (list(out.token_ids), out.text, out.finish_reason) == (
            plain.tokens[f"r{i}"],
            plain.text[f"r{i}"],
            FinishReason.LENGTH,
        )
