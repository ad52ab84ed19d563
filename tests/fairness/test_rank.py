"""`rank`: where an item, queued or running, stands in a policy's order (what the scheduler shares a step's
prefill budget by). The head `peek` returns ranks first among everything queued, in every composition."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairness import FairnessConfig, make_policy
from tests.fairness.stand_in import Job, job

CONFIGS = {
    "vtc": FairnessConfig(priority_classes=False),
    "vtc+classes": FairnessConfig(),
    "vtc+classes+edf": FairnessConfig(edf=True),
    "fcfs+classes": FairnessConfig(policy="fcfs"),
    "user": FairnessConfig(key="user", max_flows_per_tenant=2),
    "tenant/user": FairnessConfig(key="tenant/user"),
    "vtc-locality, slack 0": FairnessConfig(policy="vtc-locality", locality_slack=0),
}

# (tenant, user, class, deadline or None, then: 0 add / 1 admit the head / 2 charge a running item)
operations = st.lists(
    st.tuples(
        st.sampled_from("abc"),
        st.sampled_from(["u1", "u2", "u3", None]),
        st.integers(0, 1),
        st.one_of(st.none(), st.floats(0, 100)),
        st.integers(0, 2),
        st.integers(1, 600),
    ),
    max_size=60,
)


@pytest.mark.parametrize("name", CONFIGS)
@settings(max_examples=40, deadline=None)
@given(ops=operations)
def test_the_head_peek_returns_ranks_first_among_the_queued(name: str, ops: list[Any]) -> None:
    policy = make_policy(CONFIGS[name])
    queued: list[Job] = []
    running: list[Job] = []
    for i, (tenant, user, cls, deadline, op, tokens) in enumerate(ops):
        if op == 0 or not queued:
            item = job(f"r{i}", tenant, user=user, priority=cls, deadline=deadline, arrival_time=float(i))
            policy.add(item, float(i))
            queued.append(item)
        elif op == 1:
            head = policy.peek(float(i))
            policy.pop(head)
            queued.remove(head)
            running.append(head)
            policy.charge(head, tokens, 0, 0)
        elif running:
            policy.charge(running[i % len(running)], tokens, 1, 0)
        head = policy.peek(float(i))
        assert (head is None) == (not queued)
        assert head is None or all(policy.rank(head) <= policy.rank(other) for other in queued)
        for other in running:
            policy.rank(other)  # defined for running items too


def test_vtc_rank_is_the_keys_counter_and_reads_only() -> None:
    policy = make_policy(FairnessConfig(priority_classes=False))
    a, b = job("a", "A"), job("b", "B")
    policy.add(a, 0.0)
    policy.pop(a)
    policy.charge(a, 300, 0, 0)
    policy.add(b, 0.0)
    before = dict(policy.counters())
    assert policy.rank(a) == (300.0,) and policy.rank(b) == (before["B"],)
    assert policy.rank(job("c", "C")) == (0.0,)  # a key never seen
    assert policy.counters() == before and len(policy) == 1


def test_a_bounded_key_rank_remembers_no_new_name() -> None:
    policy = make_policy(FairnessConfig(key="user", priority_classes=False, max_flows_per_tenant=1))
    policy.add(job("x", "A", user="u1"), 0.0)
    assert policy.rank(job("y", "A", user="invented")) == policy.rank(job("z", "A"))  # counted as the tenant
    assert policy.keys_of("A") == 1


def test_classes_rank_before_counters_and_deadlines_before_the_rest() -> None:
    policy = make_policy(FairnessConfig(edf=True))
    low, high = job("low", "A", priority=1), job("high", "B", priority=0)
    late, due = job("late", "A"), job("due", "B", deadline=5.0)
    for item in (low, high, late, due):
        policy.add(item, 0.0)
    policy.charge(due, 5000, 0, 0)  # B is served far more, yet its deadline item goes first in class 0
    assert policy.rank(due) < policy.rank(late) < policy.rank(low)
    assert policy.rank(high) < policy.rank(low)
