"""The step cost model (engine/core/step_cost.py) in the step's budget and in the fair-share charge (issue 54).

The flood is the issue's: tenant B keeps 48 loops, each re-sending its own cached 2,047-token prompt with
`max_tokens` 1, so each admission computes only the tail past the cached blocks; tenant A keeps one fresh
100-token request in flight. What is asserted is what the scheduler put into the steps that hold A's
prompt, never a time.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from engine.core.kv_cache import BlockPool
from engine.core.request import Request, RequestMeta
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import Scheduler, SchedulerOutput
from engine.core.step_cost import TOKENS_ONLY, StepCost
from tests.defaults import COST, scheduler_config, vtc

# About the CPU defaults for the embedded model (engine/core/step_cost.py DEVICE_DEFAULTS).
MODEL = StepCost(context=0.003, sequence=12.0)
BUDGET, SEATS, BLOCK = 512, 64, 16
B_LOOPS, B_PROMPT, A_PROMPT = 48, 2047, 100


def _prompt(seed: int, length: int) -> list[int]:
    return [1 + (seed * 7919 + i * 104729) % 30011 for i in range(length)]


def _scheduler(cost: StepCost) -> Scheduler:
    config = scheduler_config(
        max_num_batched_tokens=BUDGET, max_num_seqs=SEATS, max_model_len=4096, watermark_blocks=0
    )
    config.step_cost, config.charge_step_work = cost, True
    return Scheduler(config, BlockPool(16384, BLOCK, True), vtc())


def _request(rid: str, tenant: str, prompt: list[int]) -> Request:
    return Request(rid, list(prompt), SamplingParams(max_tokens=1), RequestMeta(tenant_id=tenant))


def _step(s: Scheduler, now: float) -> SchedulerOutput:
    out = s.schedule(now)
    s.update(out, {c.request.request_id: 7 for c in out.chunks if c.samples}, {0})
    return out


def _flood(cost: StepCost, steps: int = 120) -> tuple[list[SchedulerOutput], list[Request], list[Request]]:
    """Warm B's 48 prompts into the cache, then run the flood; the steps that held an A prompt chunk, and
    every A and B request served in the flood."""
    s = _scheduler(cost)
    b_prompts = [_prompt(n, B_PROMPT) for n in range(B_LOOPS)]
    for n, prompt in enumerate(b_prompts):
        s.add(_request(f"warm-{n}", "B", prompt))
    while s.has_unfinished():
        _step(s, 0.0)
    live_b = [_request(f"b{n}-0", "B", p) for n, p in enumerate(b_prompts)]
    a = _request("a-0", "A", _prompt(10_000, A_PROMPT))
    a_done: list[Request] = []
    b_done: list[Request] = []
    for r in [a, *live_b]:
        s.add(r, 1.0)
    holding_a: list[SchedulerOutput] = []
    for i in range(steps):
        now = 1.0 + i
        out = _step(s, now)
        if any(c.request.meta.tenant_id == "A" for c in out.chunks):
            holding_a.append(out)
        if a.is_finished:
            a_done.append(a)
            a = _request(f"a-{i + 1}", "A", _prompt(10_001 + i, A_PROMPT))
            s.add(a, now)
        for n, r in enumerate(live_b):
            if r.is_finished:
                b_done.append(r)
                live_b[n] = _request(f"b{n}-{i + 1}", "B", b_prompts[n])
                s.add(live_b[n], now)
    return holding_a, a_done, b_done


def _cost(out: SchedulerOutput, cost: StepCost) -> float:
    return sum(cost.chunk(c.start, c.length) for c in out.chunks)


def test_with_a_cached_prompt_flood_the_step_holding_a_schedules_at_most_the_budgets_work() -> None:
    holding_a, a_done, b_done = _flood(MODEL)
    assert a_done and b_done, "both tenants must be served"
    assert all(r.num_cached_tokens >= B_PROMPT - BLOCK for r in b_done), "B's prompts must be cache hits"
    budget = MODEL.budget(BUDGET)
    assert max(_cost(out, MODEL) for out in holding_a) <= budget
    # A's 100-token prompt runs whole in the step after it arrives: one step per request.
    assert all(len([c for c in out.chunks if c.request.meta.tenant_id == "A"]) == 1 for out in holding_a)
    assert len(holding_a) == len(a_done) + 1 or len(holding_a) == len(a_done)


def test_counting_new_tokens_only_the_same_flood_makes_a_s_step_many_budgets_long() -> None:
    holding_a, _, _ = _flood(TOKENS_ONLY, steps=40)
    # The same steps, priced by the model: B's cached tails fill 512 new tokens, many times the budget.
    assert max(_cost(out, MODEL) for out in holding_a) > 3 * MODEL.budget(BUDGET)


def test_a_cached_prompt_is_charged_its_tail_and_the_context_it_attends_over() -> None:
    s = _scheduler(MODEL)
    prompt = _prompt(1, B_PROMPT)
    s.add(_request("warm", "B", prompt))
    while s.has_unfinished():
        _step(s, 0.0)
    twin = _request("twin", "B", prompt)
    s.add(twin, 1.0)
    while s.has_unfinished():
        _step(s, 1.0)
    cached = twin.num_cached_tokens
    tail = B_PROMPT - cached
    work = int(MODEL.work(cached, tail, samples=True))
    assert twin.charged_service == COST.w_in * (tail + work) + COST.w_out * 1 + COST.w_cached * cached
    assert work > 5 * tail  # the context it attends over, not its 15 new tokens, is most of the step's work


@given(
    start=st.integers(0, 4096),
    cuts=st.lists(st.integers(1, 300), min_size=1, max_size=8),
    context=st.floats(0, 0.01),
    sequence=st.floats(0, 32),
)
def test_a_prompt_s_attention_charge_is_the_same_however_it_is_chunked(
    start: int, cuts: list[int], context: float, sequence: float
) -> None:
    cost = StepCost(context, sequence)
    whole = cost.work(start, sum(cuts), samples=True)
    parts, at = 0.0, start
    for i, length in enumerate(cuts):
        parts += cost.work(at, length, samples=i == len(cuts) - 1)
        at += length
    assert abs(parts - whole) <= 1e-6 * max(1.0, whole)


@given(
    start=st.integers(0, 8192),
    budget=st.floats(0, 5000),
    most=st.integers(0, 4096),
    context=st.floats(0, 0.05),
    sequence=st.floats(0, 64),
)
def test_fit_is_the_longest_chunk_within_the_budget(
    start: int, budget: float, most: int, context: float, sequence: float
) -> None:
    cost = StepCost(context, sequence)
    length = cost.fit(start, budget, most)
    assert 0 <= length <= most
    if length:
        assert cost.chunk(start, length) <= budget + 1e-6
    if length < most and budget - sequence >= 1:
        assert cost.chunk(start, length + 1) > budget - 1e-6
