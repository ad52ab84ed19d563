"""One EngineStats for many engines: counts and rates add up, the slowest iteration, alive if any is."""

from __future__ import annotations

from engine.core.outputs import EngineStats
from routing.stats import aggregate_stats


def test_stats_of_many_engines_add_up() -> None:
    a = EngineStats(
        waiting=2,
        running=3,
        kv_blocks_total=64,
        waiting_by_tenant={"x": 2},
        service={"x": 1.5},
        iteration_seconds=0.02,
        max_num_seqs=8,
        prefill_tokens_per_s=100.0,
    )
    b = EngineStats(
        waiting=1,
        running=0,
        kv_blocks_total=32,
        waiting_by_tenant={"x": 1, "y": 4},
        service={"y": 2.0},
        iteration_seconds=0.05,
        max_num_seqs=4,
        prefill_tokens_per_s=50.0,
        alive=False,
    )
    s = aggregate_stats([a, b])
    assert (s.waiting, s.running, s.kv_blocks_total, s.max_num_seqs) == (3, 3, 96, 12)
    assert s.waiting_by_tenant == {"x": 3, "y": 4} and s.service == {"x": 1.5, "y": 2.0}
    assert s.iteration_seconds == 0.05 and s.prefill_tokens_per_s == 150.0 and s.alive
    assert not aggregate_stats([]).alive


def test_one_engine_stats_are_a_copy() -> None:
    one = EngineStats(waiting=2, service={"x": 1.0})
    merged = aggregate_stats([one])
    merged.alive = False
    assert merged == EngineStats(waiting=2, service={"x": 1.0}, alive=False) and one.alive
