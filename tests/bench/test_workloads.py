"""Workload plans: deterministic, at the offered rate, bursts silent when off, prefixes shared as declared."""

from __future__ import annotations

import random

import pytest

from bench.workloads import WORKLOADS, TenantTraffic, arrival_times, plan


def test_plan_is_deterministic_and_sorted() -> None:
    a = plan(WORKLOADS["chat"], 10.0, 5.0, seed=3)
    b = plan(WORKLOADS["chat"], 10.0, 5.0, seed=3)
    assert [(p.at, p.tenant, p.prompt, p.max_tokens) for p in a] == [
        (p.at, p.tenant, p.prompt, p.max_tokens) for p in b
    ]
    assert [p.at for p in a] == sorted(p.at for p in a)
    assert plan(WORKLOADS["chat"], 10.0, 5.0, seed=4)[0].prompt != a[0].prompt


@pytest.mark.parametrize("arrival", ["poisson", "bursty"])
def test_arrivals_keep_the_mean_rate(arrival: str) -> None:
    tenant = TenantTraffic("t", 1.0, 1.0, arrival=arrival)
    times = arrival_times(tenant, 20.0, 200.0, random.Random(1))
    assert len(times) / 200.0 == pytest.approx(20.0, rel=0.1)
    assert all(0 <= t < 200.0 for t in times)


def test_bursty_tenant_is_silent_while_off() -> None:
    tenant = TenantTraffic("t", 1.0, 1.0, arrival="bursty", on_s=0.5, off_s=1.5)
    times = arrival_times(tenant, 10.0, 100.0, random.Random(2))
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    # Every 2 s period has a 1.5 s silence, so long gaps recur about once per period.
    assert sum(1 for g in gaps if g >= 1.4) >= 40
    poisson = arrival_times(TenantTraffic("p", 1.0, 1.0), 10.0, 100.0, random.Random(2))
    assert sum(1 for a, b in zip(poisson, poisson[1:], strict=False) if b - a >= 1.4) < 5


def test_workloads_declare_their_shapes() -> None:
    retrieval = plan(WORKLOADS["retrieval"], 20.0, 10.0)
    prefix = retrieval[0].prompt[: WORKLOADS["retrieval"].prefix_tokens]
    shared = sum(1 for p in retrieval if p.prompt.startswith(prefix)) / len(retrieval)
    assert 0.5 < shared <= 1.0
    assert all(320 <= len(p.prompt) <= 480 for p in retrieval)
    agent = plan(WORKLOADS["agent"], 5.0, 10.0)
    assert all(len(p.max_tokens) == 3 and p.task_id for p in agent)
    assert len({p.task_id for p in agent}) == len(agent)
    noisy = [t for t in WORKLOADS["chat"].tenants if t.noisy]
    assert len(noisy) == 1 and noisy[0].arrival == "bursty"
    declared = WORKLOADS["mixed"].declare()
    assert {"prompt_tokens", "output_tokens", "prefix_sharing", "sampling", "tenants", "slo"} <= set(declared)
