"""Simulated pools, co-located against prefill/decode apart (sim/disagg.py): every token served and
charged once, the KV transfer's cost, and the interference a disaggregated pool removes."""

from __future__ import annotations

import pytest

from sim.disagg import Link, Pool
from sim.simulator import SimConfig, SimRequest

CONFIG = SimConfig(max_num_batched_tokens=512, max_num_seqs=32, num_blocks=4096)


def workload() -> list[SimRequest]:
    return [
        SimRequest(f"r{i}", f"t{i % 3}", arrival=i * 0.01, prompt_tokens=50 + 37 * i, output_tokens=1 + 5 * i)
        for i in range(12)
    ]


def test_every_request_gets_its_tokens_and_each_token_is_charged_once() -> None:
    together = Pool(2, 0, CONFIG).run(workload())
    apart = Pool(2, 1, CONFIG).run(workload())
    for spec in workload():
        a, b = together.served[spec.name], apart.served[spec.name]
        assert a.output_tokens == b.output_tokens == spec.output_tokens
        assert b.charged == pytest.approx(a.charged)
        assert (b.transfer_s > 0) == (spec.output_tokens > 1)  # one-token outputs never leave prefill
    assert all(s.transfer_s == 0 for s in together.served.values())


def test_the_transfer_costs_blocks_times_bytes_over_the_link() -> None:
    lone = [SimRequest("r", prompt_tokens=1000, output_tokens=8)]
    link = Link(bytes_per_s=1e8, latency_s=0.002)
    served = Pool(2, 1, CONFIG, link).run(lone).served["r"]
    blocks = -(-1000 // CONFIG.block_size)
    assert served.transfer_s == pytest.approx(0.002 + blocks * CONFIG.bytes_per_block / 1e8)
    fast = Pool(2, 1, CONFIG, Link(bytes_per_s=1e12)).run(lone).served["r"]
    assert served.tpot is not None and fast.tpot is not None and served.tpot > fast.tpot


def test_long_prefills_slow_a_colocated_decode_but_not_a_disaggregated_one() -> None:
    """One long generation, then a stream of long prompts: co-located, each prompt's chunks share the
    generation's iterations on its engine; apart, the decode engine runs decodes only."""
    stream = [SimRequest("gen", "a", 0.0, prompt_tokens=16, output_tokens=400)]
    stream += [
        SimRequest(f"p{i}", "b", 0.05 + 0.05 * i, prompt_tokens=2000, output_tokens=2) for i in range(40)
    ]
    together = Pool(2, 0, CONFIG).run(stream).served["gen"]
    apart = Pool(2, 1, CONFIG).run(stream).served["gen"]
    assert together.tpot is not None and apart.tpot is not None
    assert apart.tpot < together.tpot / 2


def test_a_pool_needs_an_engine_of_each_role() -> None:
    with pytest.raises(ValueError, match="prefill engines"):
        Pool(2, 2, CONFIG)
