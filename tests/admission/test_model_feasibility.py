"""Per-model feasibility: the priors until a model has reported rates, its engines' measured rates while
they report them, the learned mean when they report none (idle, restarted); models do not mix."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from admission.feasibility import RatePriors
from admission.model_feasibility import TRUNCATE_HEADROOM, ModelRates, prefill_budget

PRIORS = RatePriors(prefill_tokens_per_s=2000.0, iteration_seconds=0.05)


@dataclass
class Stats:
    prefill_tokens_per_s: float = 0.0
    decode_tokens_per_s: float = 0.0
    iteration_seconds: float = 0.0
    waiting: int = 0
    running: int = 0
    waiting_tokens: int = 0
    max_num_seqs: int = 8
    waiting_by_tenant: dict[str, int] = field(default_factory=dict)


def test_a_model_is_estimated_by_the_priors_until_it_reports_rates() -> None:
    rates = ModelRates(PRIORS)
    est = rates.estimate("slow", Stats(), "t", prompt_tokens=1000, max_tokens=10, fair=True)
    assert est.finish_s == pytest.approx(1000 / 2000 + 10 * 0.05)
    assert rates.rate("slow").source == "prior" and rates.rate("slow").samples == 0


def test_measured_rates_win_and_the_learned_ones_stand_in_when_the_engine_reports_none() -> None:
    rates = ModelRates(PRIORS)
    busy = Stats(prefill_tokens_per_s=500.0, iteration_seconds=0.02)
    est = rates.estimate("slow", busy, "t", prompt_tokens=1000, max_tokens=10, fair=True)
    assert est.finish_s == pytest.approx(1000 / 500 + 10 * 0.02)
    assert rates.effective("slow", busy).source == "measured"
    restarted = Stats()  # a fresh engine of the same model reports zeros
    est = rates.estimate("slow", restarted, "t", prompt_tokens=1000, max_tokens=10, fair=True)
    assert est.finish_s == pytest.approx(1000 / 500 + 10 * 0.02)
    assert rates.effective("slow", restarted).source == "learned"
    # Another model learned nothing from this one.
    other = rates.estimate("fast", restarted, "t", prompt_tokens=1000, max_tokens=10, fair=True)
    assert other.finish_s == pytest.approx(1000 / 2000 + 10 * 0.05)


def test_the_learned_rate_follows_new_measurements() -> None:
    rates = ModelRates(PRIORS)
    rates.observe("m", Stats(prefill_tokens_per_s=1000.0, iteration_seconds=0.01))
    for _ in range(40):
        rates.observe("m", Stats(prefill_tokens_per_s=100.0, iteration_seconds=0.1))
    learned = rates.rate("m")
    assert learned.prefill_tokens_per_s == pytest.approx(100.0, rel=0.01)
    assert learned.iteration_s == pytest.approx(0.1, rel=0.01) and learned.samples == 41


def test_the_prefill_budget_leaves_headroom_and_room_for_the_decode() -> None:
    rates = ModelRates(PRIORS)
    stats = Stats(prefill_tokens_per_s=1000.0, iteration_seconds=0.01)
    est = rates.estimate("m", stats, "t", prompt_tokens=5000, max_tokens=10, fair=True)
    rate = rates.effective("m", stats)
    # 1 s left, 0.1 s of it decode: 0.9 s of prefill at 1000 tokens/s, less the headroom.
    assert prefill_budget(est, rate, 10, 1.0) == int(0.9 * TRUNCATE_HEADROOM * 1000)
    assert prefill_budget(est, rate, 10, 0.05) < 0  # the decode alone does not fit


def test_whether_waiting_helps_is_judged_at_the_fastest_rates_the_model_has_shown() -> None:
    rates = ModelRates(PRIORS)
    rates.observe("m", Stats(prefill_tokens_per_s=1000.0, iteration_seconds=0.01))  # alone, once
    busy = Stats(prefill_tokens_per_s=1000.0, iteration_seconds=0.05)  # five times slower under load now
    est = rates.estimate("m", busy, "t", prompt_tokens=0, max_tokens=100, fair=True)
    assert est.finish_s >= 5.0 and est.run_s == pytest.approx(1.0)
    assert est.waiting_helps(2.0)  # 2 s cannot hold the run now, but it could once the load is gone
    assert not est.waiting_helps(0.5)
