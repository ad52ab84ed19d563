"""The simulator drives the engine's loop in both modes: async scheduling gives the same tokens and charges.

Each run mixes chunked prefills, length and stop-token ends (a request scheduled one step past its stop
token: the speculative decode is discarded and never charged), and a KV pool small enough to preempt.
"""

from __future__ import annotations

from typing import Any

import pytest

from engine.core.scheduler_output import SchedulerOutput
from fairness import FairnessConfig
from sim.simulator import SimConfig, SimRequest, SimResult, Simulator
from tests.defaults import scheduler_config

BUDGETS = scheduler_config()


def workload() -> list[SimRequest]:
    return [
        SimRequest(
            f"r{i}",
            tenant=f"t{i % 3}",
            arrival=0.002 * (i % 7),
            prompt_tokens=8 + 13 * (i % 5),
            output_tokens=6 + 5 * (i % 4),
            weight=1.0 + (i % 3),
            stop_after=3 + i % 4 if i % 3 == 0 else None,
        )
        for i in range(30)
    ]


def simulate(async_scheduling: bool, **config: Any) -> tuple[SimResult, int, Simulator]:
    sim = Simulator(
        SimConfig(
            max_num_batched_tokens=48,
            max_num_seqs=8,
            fairness=FairnessConfig(priority_classes=False),
            async_scheduling=async_scheduling,
            **{"max_model_len": BUDGETS.max_model_len, **config},
        )
    )
    steps: list[SchedulerOutput] = []
    result = sim.run(workload(), on_iteration=lambda _, out: steps.append(out))
    return result, sum(out.discarded_tokens for out in steps), sim


def outcome(result: SimResult) -> dict[str, tuple[int, str, float]]:
    return {n: (c.output_tokens, c.reason.value, c.charged) for n, c in result.completions.items()}


@pytest.mark.parametrize(
    "config",
    [
        {"num_blocks": 256},
        {"num_blocks": 24, "block_size": 4},
        {"num_blocks": 24, "block_size": 4, "preemption_mode": "swap"},
    ],
    ids=["roomy", "recompute", "swap"],
)
def test_async_scheduling_gives_the_same_tokens_and_charges(config: dict[str, Any]) -> None:
    plain, plain_discarded, plain_sim = simulate(False, **config)
    overlapped, discarded, overlapped_sim = simulate(True, **config)
    assert len(plain.completions) == 30
    assert outcome(overlapped) == outcome(plain)
    assert dict(overlapped_sim.service()) == dict(plain_sim.service())
    reasons = {c.reason.value for c in plain.completions.values()}
    assert reasons == {"stop", "length"}
    assert plain_discarded == 0 and discarded > 0  # speculative decodes past a stop token, thrown away
    if config["num_blocks"] == 24:
        assert plain.preemptions > 0 and overlapped.preemptions > 0
    for sim in (plain_sim, overlapped_sim):
        assert sim.pool.num_used == 0 and not sim.scheduler.requests
