"""The simulator's upstream mode (sim/upstream.py): fairserve's dispatch in front of an engine that
serves requests, not tenants. Through a window, VTC keeps two backlogged tenants within the bound
max(2, W)·U / w_min and splits tokens by weight; first come first served (what the engine alone does)
breaks the bound; and a window so large that nothing waits at the gateway leaves the split to the engine."""

from __future__ import annotations

import pytest

from sim.upstream import UpstreamSimConfig, simulate_upstream


@pytest.mark.parametrize("window", [1, 4, 8])
def test_through_a_window_vtc_stays_within_its_bound_and_splits_3_to_1(window: int) -> None:
    config = UpstreamSimConfig(window=window, steps=8000)
    run = simulate_upstream(config)
    assert run.backlogged_steps > 0
    assert run.max_difference <= config.bound()
    share = run.tokens["A"] / sum(run.tokens.values())
    assert share == pytest.approx(0.75, abs=0.025)


@pytest.mark.parametrize("window", [1, 8])
def test_first_come_first_served_breaks_the_bound(window: int) -> None:
    config = UpstreamSimConfig(window=window, steps=8000, policy="fcfs")
    run = simulate_upstream(config)
    assert run.max_difference > config.bound()
    assert run.tokens["A"] / sum(run.tokens.values()) < 0.65  # by request count, not by weight


def test_a_window_past_every_client_leaves_nothing_to_order_and_the_engine_splits_by_requests() -> None:
    config = UpstreamSimConfig(window=64, slots=16, steps=8000)
    run = simulate_upstream(config)
    assert run.max_engine_queue > 0  # the engine holds requests the policy never saw
    assert run.tokens["A"] / sum(run.tokens.values()) == pytest.approx(0.5, abs=0.05)
