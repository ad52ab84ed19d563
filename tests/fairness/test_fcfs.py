"""FCFS: arrival order, preempted first, O(1) removal, victims and per-key service."""

from __future__ import annotations

from typing import Any

import pytest

from fairness import DuplicateItemError, FCFSPolicy, api_key_key
from tests.defaults import COST
from tests.fairness.stand_in import drain, job


def test_admits_in_arrival_order_and_preempted_requests_first() -> None:
    policy: FCFSPolicy[Any] = FCFSPolicy(COST)
    items = [job(f"r{i}", f"t{i % 3}") for i in range(6)]
    for item in items:
        policy.add(item, 0.0)
    first = policy.peek(0.0)
    assert first is items[0]
    policy.pop(items[0])
    policy.remove(items[3])
    policy.add(items[0], 1.0, front=True)  # preempted: back to the head
    assert drain(policy) == ["r0", "r1", "r2", "r4", "r5"]
    assert len(policy) == 0


def test_pop_of_a_non_head_item_and_remove_of_an_absent_one() -> None:
    policy: FCFSPolicy[Any] = FCFSPolicy(COST)
    a, b, c = job("a"), job("b"), job("c")
    for item in (a, b, c):
        policy.add(item, 0.0)
    policy.pop(b)
    policy.remove(job("never-queued"))
    assert b not in policy and a in policy
    assert drain(policy) == ["a", "c"]


def test_removals_do_not_keep_stale_entries_forever() -> None:
    policy: FCFSPolicy[Any] = FCFSPolicy(COST)
    keep = job("keep")
    policy.add(keep, 0.0)
    for i in range(10_000):
        item = job(f"gone{i}")
        policy.add(item, 0.0)
        policy.remove(item)
    assert len(policy._queue._entries) < 200  # compacted: memory stays O(live items)
    assert drain(policy) == ["keep"]


def test_equal_items_are_distinct_requests() -> None:
    policy: FCFSPolicy[Any] = FCFSPolicy(COST)
    policy.add(job("same"), 0.0)
    with pytest.raises(DuplicateItemError):
        policy.add(job("same"), 0.0)


def test_victim_is_the_latest_arrival_of_the_lowest_class() -> None:
    policy: FCFSPolicy[Any] = FCFSPolicy(COST)
    old_low = job("o", priority=2, arrival_time=1.0)
    new_low = job("n", priority=2, arrival_time=5.0)
    newest_high = job("h", priority=0, arrival_time=9.0)
    running = [old_low, newest_high, new_low]
    assert policy.victim(running) is new_low
    assert policy.victim([newest_high], for_item=job("x", priority=1)) is None
    assert policy.victim(running, for_item=newest_high) is new_low


def test_service_is_charged_per_fairness_key() -> None:
    policy: FCFSPolicy[Any] = FCFSPolicy(COST, key_fn=api_key_key)
    k1, k2, bare = job("1", "acme", api_key_id="k1"), job("2", "acme", api_key_id="k2"), job("3", "acme")
    policy.charge(k1, 10, 0, 0)
    policy.charge(k2, 0, 5, 0)
    policy.charge(bare, 0, 0, 100)
    assert policy.service() == {"k1": 10.0, "k2": 10.0, "acme": 0.0}
