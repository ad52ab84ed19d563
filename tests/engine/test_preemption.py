"""Preemption under memory pressure: swap and recompute give the unpreempted output; records; watermark."""

from __future__ import annotations

import pytest

from engine.core.kv_cache import BlockPool
from engine.core.request import Request, RequestMeta
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import Scheduler, SchedulerOutput
from engine.serving.llm import LLM
from sim.simulator import SimConfig, SimRequest, Simulator
from tests.defaults import fcfs, scheduler_config

PROMPTS = [f"prompt {i}: the batch never waits" for i in range(4)]
PARAMS = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def reference() -> list[list[int]]:
    """Greedy outputs with blocks to spare: nothing is preempted."""
    llm = LLM(None, num_kv_blocks=256, block_size=4)
    outs = llm.generate(PROMPTS, PARAMS)
    assert all(o.preemptions == 0 for o in outs)
    return [o.token_ids for o in outs]


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_preempted_requests_resume_with_the_unpreempted_output(mode: str, reference: list[list[int]]) -> None:
    # Each request grows to ~45 tokens (12 blocks of 4); 20 blocks hold one and a half of them.
    llm = LLM(None, preemption_mode=mode, num_kv_blocks=20, block_size=4, enable_prefix_caching=False)
    outs = llm.generate(PROMPTS, PARAMS)
    assert [o.token_ids for o in outs] == reference
    assert sum(o.preemptions for o in outs) > 0, "the pool must be too small for the batch"
    sched, pool = llm.engine.scheduler, llm.engine.pool
    if mode == "swap":
        assert sched.swapped_bytes_total > 0 and sched.recomputed_tokens_total == 0
    else:
        assert sched.recomputed_tokens_total > 0 and sched.swapped_bytes_total == 0
    assert llm.engine.runner.swapped_bytes() == 0, "a swapped copy was left behind"
    pool.check_invariants()
    assert pool.num_free == pool.num_blocks, "a block leaked"


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_every_preemption_records_reason_mode_victim_and_cost(mode: str) -> None:
    config = SimConfig(
        max_num_batched_tokens=64, max_num_seqs=4, num_blocks=12, block_size=4, preemption_mode=mode
    )
    records: list[tuple[str, str, str, int, int, float]] = []

    def collect(_: Simulator, out: SchedulerOutput) -> None:
        records.extend(
            (v.request_id, r.reason, r.mode, r.tokens_recomputed, r.bytes_swapped, r.seconds)
            for v, r in out.preempted
        )

    workload = [SimRequest(f"r{i}", arrival=0.001 * i, prompt_tokens=4, output_tokens=16) for i in range(4)]
    result = Simulator(config).run(workload, on_iteration=collect)
    assert records and len(records) == result.preemptions
    for victim, reason, record_mode, recomputed, swapped, seconds in records:
        assert victim in result.completions and reason == "kv_blocks_exhausted" and record_mode == mode
        assert seconds >= 0
        assert (swapped > 0 and recomputed == 0) if mode == "swap" else (recomputed > 0 and swapped == 0)
    assert sum(c.preemptions for c in result.completions.values()) == len(records)
    # FCFS preempts the latest arrival first.
    assert records[0][0] == "r3"


def _admitted_with_watermark(watermark: int) -> tuple[int, Scheduler]:
    cfg = scheduler_config(
        max_num_batched_tokens=256, max_num_seqs=16, max_model_len=512, watermark_blocks=watermark
    )
    s = Scheduler(cfg, BlockPool(16, 4, enable_prefix_caching=False), fcfs())
    for i in range(6):
        s.add(Request(f"r{i}", [1] * 8, SamplingParams(max_tokens=8), RequestMeta()), 0.0)
    out = s.schedule(0.0)
    return len(out.chunks), s


def test_admission_keeps_the_watermark_free_and_counts_requests_waiting_for_blocks() -> None:
    admitted, s = _admitted_with_watermark(0)
    assert admitted == 6 and s.waiting_for_blocks == 0 and s.block_waits_total == 0
    admitted, s = _admitted_with_watermark(6)
    assert admitted == 5  # 16 blocks, two per prompt, six held back
    assert s.pool.num_free >= 6
    assert s.waiting_for_blocks == 1 and s.block_waits_total == 1
