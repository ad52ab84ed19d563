from __future__ import annotations

import pytest

from admission.feasibility import RatePriors, drain_seconds, estimate, requests_ahead
from tests.admission.stats import Stats
from tests.defaults import PRIORS


def test_fcfs_counts_everything_queued() -> None:
    stats = Stats(waiting=7, waiting_by_tenant={"a": 6, "b": 1})
    assert requests_ahead(stats, "b", fair=False) == 7


def test_fair_policy_caps_other_tenants_at_own_depth() -> None:
    stats = Stats(waiting=21, waiting_by_tenant={"a": 20, "b": 1})
    # b has one queued; a interleaves at most two requests ahead of b's next one.
    assert requests_ahead(stats, "b", fair=True) == 3
    assert requests_ahead(stats, "c", fair=True) == 2  # one round: a and b each once
    assert requests_ahead(stats, "a", fair=True) == 21


def test_empty_engine_starts_immediately() -> None:
    est = estimate(Stats(), "a", prompt_tokens=100, max_tokens=10, fair=True, priors=PRIORS)
    assert est.start_s == 0
    assert est.finish_s == pytest.approx(100 / 1000 + 10 * 0.01)


def test_queue_ahead_delays_start_by_prefill_rate() -> None:
    stats = Stats(waiting=4, waiting_by_tenant={"x": 4}, waiting_tokens=2000, prefill_tokens_per_s=500.0)
    est = estimate(stats, "x", prompt_tokens=10, max_tokens=1, fair=False, priors=PRIORS)
    assert est.tokens_ahead == 2000
    assert est.start_s == pytest.approx(4.0)


def test_full_slots_add_turnover() -> None:
    stats = Stats(running=8, max_num_seqs=8, iteration_seconds=0.1)
    assert estimate(stats, "a", 0, 0, True, PRIORS).start_s == pytest.approx(0.1)


def test_cold_engine_uses_priors() -> None:
    stats = Stats(prefill_tokens_per_s=0.0, iteration_seconds=0.0)
    est = estimate(
        stats, "a", 400, 4, fair=True, priors=RatePriors(prefill_tokens_per_s=100.0, iteration_seconds=0.5)
    )
    assert est.finish_s == pytest.approx(4.0 + 2.0)


def test_drain_is_the_slower_of_tokens_and_requests() -> None:
    stats = Stats(waiting=10, waiting_tokens=1000, prefill_tokens_per_s=100.0, iteration_seconds=0.01)
    assert drain_seconds(stats, excess_tokens=300, excess_requests=0, priors=PRIORS) == pytest.approx(3.0)
    assert drain_seconds(stats, excess_tokens=0, excess_requests=5, priors=PRIORS) == pytest.approx(5.0)
