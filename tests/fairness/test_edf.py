"""EDF: deadlines first by deadline, the rest by the base policy; accounting stays with the base."""

from __future__ import annotations

from typing import Any

import pytest

from fairness import DuplicateItemError, EDFPolicy, VTCPolicy
from tests.defaults import fcfs, vtc
from tests.fairness.stand_in import drain, job


def test_deadlines_first_in_deadline_order_then_the_base_policy() -> None:
    policy: EDFPolicy[Any] = EDFPolicy(fcfs())
    policy.add(job("none1"), 0.0)
    policy.add(job("late", deadline=300.0), 0.0)
    policy.add(job("none2"), 0.0)
    policy.add(job("soon", deadline=100.0), 0.0)
    policy.add(job("mid", deadline=200.0), 0.0)
    policy.add(job("soon-too", deadline=100.0), 0.0)
    assert len(policy) == 6
    assert drain(policy) == ["soon", "soon-too", "mid", "late", "none1", "none2"]


def test_items_without_deadline_follow_vtc_order() -> None:
    base: VTCPolicy[Any] = vtc()
    policy: EDFPolicy[Any] = EDFPolicy(base)
    heavy = job("h0", "heavy")
    base.charge(heavy, 1000, 0, 0)
    policy.add(job("l1", "light"), 0.0)  # light first, or it would be lifted to heavy's counter
    policy.add(job("h1", "heavy"), 0.0)
    policy.add(job("d1", "heavy", deadline=50.0), 0.0)
    assert drain(policy) == ["d1", "l1", "h1"]


def test_remove_and_requeue_of_deadline_items() -> None:
    policy: EDFPolicy[Any] = EDFPolicy(fcfs())
    a, b = job("a", deadline=10.0), job("b", deadline=20.0)
    policy.add(a, 0.0)
    policy.add(b, 0.0)
    with pytest.raises(DuplicateItemError):
        policy.add(a, 0.0)
    policy.remove(a)
    assert policy.peek(0.0) is b
    policy.add(a, 1.0, front=True)
    assert drain(policy) == ["a", "b"]


def test_deadline_traffic_is_charged_to_the_key() -> None:
    policy: EDFPolicy[Any] = EDFPolicy(vtc())
    item = job("d", "acme", deadline=5.0)
    policy.add(item, 0.0)
    policy.pop(item)
    policy.charge(item, 10, 1, 0)
    assert policy.service() == {"acme": 12.0}
    assert policy.counters() == {"acme": 12.0}


def test_victim_prefers_requests_without_a_deadline_then_the_latest_deadline() -> None:
    policy: EDFPolicy[Any] = EDFPolicy(fcfs())
    relaxed = job("r", arrival_time=1.0)
    urgent = job("u", deadline=10.0, arrival_time=5.0)
    patient = job("p", deadline=99.0, arrival_time=2.0)
    assert policy.victim([urgent, relaxed, patient]) is relaxed
    assert policy.victim([urgent, patient]) is patient
    assert policy.victim([urgent], for_item=job("x", priority=1)) is None
