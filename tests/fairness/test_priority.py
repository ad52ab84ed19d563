"""Priority classes: strict order, aging promotion with explicit clocks, class-safe victims, charging."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairness import DuplicateItemError, FairnessError, PriorityPolicy
from tests.defaults import MAX_QUEUE_AGE_S, fcfs, vtc
from tests.fairness.stand_in import Job, Meta, drain, job


def fcfs_classes(max_age: float = float("inf")) -> PriorityPolicy[Any]:
    return PriorityPolicy(fcfs, max_age)


def test_more_important_classes_always_go_first() -> None:
    policy = fcfs_classes()
    policy.add(job("batch", priority=2), 0.0)
    policy.add(job("std", priority=1), 0.0)
    policy.add(job("vip", priority=0), 0.0)
    policy.add(job("std2", priority=1), 0.0)
    assert drain(policy) == ["vip", "std", "std2", "batch"]


def test_vtc_orders_keys_within_a_class() -> None:
    policy: PriorityPolicy[Any] = PriorityPolicy(vtc, MAX_QUEUE_AGE_S)
    heavy = job("h0", "heavy", priority=1)
    policy.charge(heavy, 500, 0, 0)
    policy.add(job("l1", "light", priority=1), 0.0)
    policy.add(job("h1", "heavy", priority=1), 0.0)
    policy.add(job("v1", "heavy", priority=0), 0.0)
    assert drain(policy) == ["v1", "l1", "h1"]


def test_aging_promotes_an_item_to_the_next_class_after_max_queue_age() -> None:
    policy = fcfs_classes(max_age=10.0)
    policy.add(job("old-batch", priority=1), 0.0)
    policy.add(job("b", priority=0), 5.0)
    assert policy.peek(9.9).request_id == "b"  # type: ignore[union-attr]
    policy.pop(policy.peek(9.9))
    policy.add(job("c", priority=0), 9.9)
    assert policy.peek(9.95).request_id == "c"  # type: ignore[union-attr]  # not yet 10 s old
    policy.add(job("d", priority=0), 9.97)
    policy.pop(policy.peek(9.97))
    assert policy.peek(10.0).request_id == "d"  # type: ignore[union-attr]  # promoted now, queued behind d
    policy.pop(policy.peek(10.0))
    policy.add(job("e", priority=0), 10.1)
    assert drain(policy, now=10.2) == ["old-batch", "e"]  # without aging, e would go first


def test_an_overdue_item_climbs_one_class_per_period() -> None:
    policy = fcfs_classes(max_age=10.0)
    policy.add(job("z", priority=5), 0.0)
    for cls in (0, 1):
        policy.add(job(f"busy{cls}", priority=cls), 0.0)
    policy.peek(100.0)  # busy1 and z are both overdue; each climbs one class
    assert policy.waiting_by_class() == {0: 2, 1: 1, 5: 0}
    policy.peek(109.0)  # z has been in class 1 for 9 s only
    assert policy.waiting_by_class() == {0: 2, 1: 1, 5: 0}
    policy.peek(110.0)
    assert policy.waiting_by_class() == {0: 3, 1: 0, 5: 0}
    assert drain(policy, now=110.0) == ["busy0", "busy1", "z"]


def test_charges_of_a_promoted_item_land_in_the_class_it_was_admitted_in() -> None:
    policy: PriorityPolicy[Any] = PriorityPolicy(vtc, 10.0)
    policy.add(job("anchor", "other", priority=0), 0.0)
    late = job("late", "batchy", priority=1)
    policy.add(late, 0.0)
    policy.pop(policy.peek(10.0))  # late is promoted to class 0 here
    assert policy.peek(10.0) is late
    policy.pop(late)
    policy.charge(late, 40, 0, 0)
    by_class = policy.counters_by_class()
    assert by_class[0]["batchy"] == 40
    assert by_class[1].get("batchy", 0.0) == 0
    policy.finish(late)
    policy.charge(late, 1, 0, 0)  # after finish the nominal class is charged
    assert policy.counters_by_class()[1]["batchy"] == 1
    assert policy.service()["batchy"] == 41


def test_preempted_promoted_item_returns_to_its_admitted_class() -> None:
    policy = fcfs_classes(max_age=1.0)
    policy.add(job("top", priority=0), 0.0)
    low = job("low", priority=3)
    policy.add(low, 0.0)
    policy.pop(policy.peek(2.0))
    assert policy.peek(2.0) is low
    policy.pop(low)
    policy.add(job("new-top", priority=0), 2.5)
    policy.add(low, 3.0, front=True)  # preempted
    assert drain(policy, now=3.0) == ["low", "new-top"]


def test_set_weight_reaches_every_class_including_later_ones() -> None:
    policy: PriorityPolicy[Any] = PriorityPolicy(vtc, MAX_QUEUE_AGE_S)
    policy.add(job("a", "acme", priority=0), 0.0)
    policy.set_weight("acme", 4.0)
    late = job("b", "acme", priority=7)
    policy.charge(late, 8, 0, 0)  # class 7 is created after set_weight
    assert policy.counters_by_class()[7]["acme"] == 2.0


def test_bad_configuration_and_duplicates_are_refused() -> None:
    with pytest.raises(FairnessError, match="max_queue_age_s"):
        PriorityPolicy(fcfs, 0.0)
    policy = fcfs_classes()
    item = job("x", priority=1)
    policy.add(item, 0.0)
    with pytest.raises(DuplicateItemError):
        policy.add(item, 0.0)


running_sets = st.lists(
    st.tuples(st.integers(0, 3), st.sampled_from(["a", "b", "c"]), st.floats(0, 100)), min_size=0, max_size=12
)


@pytest.mark.parametrize("make_base", [fcfs, vtc])
@given(running=running_sets, for_class=st.one_of(st.none(), st.integers(0, 3)))
def test_victim_is_never_more_important_than_the_request_needing_memory(
    make_base: Any, running: list[tuple[int, str, float]], for_class: int | None
) -> None:
    policy: PriorityPolicy[Any] = PriorityPolicy(make_base, MAX_QUEUE_AGE_S)
    items = [
        Job(f"r{i}", Meta(tenant_id=t, priority=p, arrival_time=at)) for i, (p, t, at) in enumerate(running)
    ]
    for i, item in enumerate(items):
        policy.charge(item, i, 0, 0)
    for_item = None if for_class is None else Job("needy", Meta(priority=for_class))
    chosen = policy.victim(items, for_item=for_item)
    eligible = [r for r in items if for_item is None or r.meta.priority >= for_item.meta.priority]
    if not eligible:
        assert chosen is None
        return
    assert chosen is not None
    assert chosen.meta.priority == max(r.meta.priority for r in eligible)
    if make_base is fcfs:
        same_class = [r for r in eligible if r.meta.priority == chosen.meta.priority]
        assert chosen.meta.arrival_time == max(r.meta.arrival_time for r in same_class)
