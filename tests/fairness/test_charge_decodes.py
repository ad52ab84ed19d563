"""Batched decode charging: one call per step must leave every policy exactly where per-request charges would."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from fairness import FairnessConfig, make_policy
from tests.fairness.stand_in import Job, job

WEIGHTS = {"a": 1.0, "b": 3.0, "c": 7.0}


def build(policy: str, edf: bool, classes: bool) -> Any:
    return make_policy(FairnessConfig(policy=policy, edf=edf, priority_classes=classes, w_out=2.0))


def snapshot(policy: Any) -> tuple[dict[str, float], dict[str, float], list[str]]:
    """Counters, service, and the order the policy would admit what is queued (all exact, no tolerance)."""
    order = []
    while (item := policy.peek(0.0)) is not None:
        order.append(item.request_id)
        policy.pop(item)
    return dict(policy.counters()), dict(policy.service()), order


@settings(max_examples=60, deadline=None)
@given(
    policy=st.sampled_from(["vtc", "fcfs"]),
    edf=st.booleans(),
    classes=st.booleans(),
    running=st.lists(st.tuples(st.sampled_from(sorted(WEIGHTS)), st.integers(0, 2)), min_size=1, max_size=40),
    steps=st.integers(1, 5),
)
def test_batched_decode_charges_equal_per_request_charges(
    policy: str, edf: bool, classes: bool, running: list[tuple[str, int]], steps: int
) -> None:
    one, batched = build(policy, edf, classes), build(policy, edf, classes)
    items: dict[int, list[Job]] = {}
    for p in (one, batched):
        for key, weight in WEIGHTS.items():
            p.set_weight(key, weight)
        jobs = [
            job(f"r{i}", tenant, priority=cls, weight=WEIGHTS[tenant])
            for i, (tenant, cls) in enumerate(running)
        ]
        for j in jobs:  # admitted and prefilled, as the scheduler does before any decode
            p.add(j, 0.0)
            p.pop(j)
            p.charge(j, 5, 0, 0)
        for w, tenant in enumerate(sorted(WEIGHTS)):  # a backlog, so the heap and the admission order matter
            p.add(job(f"w{w}", tenant, weight=WEIGHTS[tenant]), 0.0)
        items[id(p)] = jobs
    for _ in range(steps):
        costs = [one.charge(j, 0, 1, 0) for j in items[id(one)]]
        cost = batched.charge_decodes(items[id(batched)])
        assert costs == [cost] * len(costs)
    assert snapshot(one) == snapshot(batched)
