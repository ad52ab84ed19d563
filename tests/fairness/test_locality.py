"""vtc-locality: admits only within Δ of the least-served key, prefers cached heads, is VTC at Δ = 0."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairness import FairnessConfig, make_policy
from fairness.locality import LocalityVTCPolicy
from tests.defaults import COST, LIFT, vtc
from tests.fairness.stand_in import Job, job


def _policy(slack: float, cached: dict[str, int]) -> LocalityVTCPolicy[Any]:
    return LocalityVTCPolicy(
        COST,
        lift_allowance=LIFT,
        locality_slack=slack,
        cached_blocks=lambda item: cached.get(item.request_id, 0),
    )


def test_prefers_the_cached_head_within_the_slack_only() -> None:
    cached = {"b1": 5, "c1": 9}
    policy = _policy(100.0, cached)
    for rid, tenant in (("a1", "a"), ("b1", "b"), ("c1", "c")):
        policy.add(job(rid, tenant), 0.0)
    policy.charge(job("x", "b"), 50, 0, 0)  # b: 50 above a, within the slack
    policy.charge(job("y", "c"), 150, 0, 0)  # c: 150 above a, outside it, however much it has cached
    head = policy.peek(0.0)
    assert head is not None and head.request_id == "b1"
    cached["b1"] = 0
    head = policy.peek(0.0)
    assert head is not None and head.request_id == "a1"  # nothing cached within reach: plain VTC


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 5), st.integers(0, 400), st.integers(0, 8)), min_size=1, max_size=30),
    st.sampled_from([0.0, 64.0, 256.0]),
)
def test_the_admitted_key_is_never_more_than_the_slack_above_the_least(
    steps: list[tuple[int, int, int]], slack: float
) -> None:
    cached: dict[str, int] = {}
    policy, plain = _policy(slack, cached), vtc()
    for i, (tenant, tokens, blocks) in enumerate(steps):
        item = job(f"r{i}", f"t{tenant}")
        cached[item.request_id] = blocks
        policy.add(item, 0.0)
        plain.add(job(item.request_id, item.meta.tenant_id), 0.0)
        head = policy.peek(0.0)
        assert head is not None
        counters = policy.counters()
        least = min(counters[k] for k in policy.waiting())
        assert counters[head.meta.tenant_id] <= least + slack
        if slack == 0:
            plain_head = plain.peek(0.0)
            assert plain_head is not None and plain_head.request_id == head.request_id
        if tokens % 2:  # admit it and charge it, as the scheduler would
            policy.pop(head)
            policy.charge(head, tokens, 0, 0)
            twin: Job = job(head.request_id, head.meta.tenant_id)
            plain.pop(twin)
            plain.charge(twin, tokens, 0, 0)


def test_registered_and_configured_like_the_others() -> None:
    policy = make_policy(FairnessConfig(policy="vtc-locality", priority_classes=False, locality_slack=7.0))
    assert isinstance(policy, LocalityVTCPolicy) and policy.locality_slack == 7.0
    with pytest.raises(ValueError, match="locality"):
        FairnessConfig(policy="vtc-locality", key="tenant/user")
    with pytest.raises(ValueError, match="locality_slack"):
        FairnessConfig(locality_slack=-1)
