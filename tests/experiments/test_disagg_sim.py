"""experiments.disagg_sim: goodput is the highest rate meeting 90% attainment; fan-out attempts each run."""

from __future__ import annotations

from bench.workloads import WORKLOADS, plan
from experiments.disagg_sim import goodput, requests


def test_goodput_is_the_highest_rate_at_ninety_percent() -> None:
    assert goodput({25: 1.0, 50: 0.95, 100: 0.5, 200: 0.91}) == 200
    assert goodput({25: 0.89}) == 0.0


def test_every_fan_out_attempt_is_a_simulated_request() -> None:
    planned = plan(WORKLOADS["agent"], 20, 2.0)
    simulated = requests("agent", 20, 2.0)
    assert len(simulated) == 3 * len(planned)
    assert simulated[0].prompt_tokens == len(planned[0].prompt) + 1  # BOS
