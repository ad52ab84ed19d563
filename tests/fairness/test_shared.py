"""Shared counters across engines, pure: what is published (charged service, never lifts) and how it merges."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairness import EDFPolicy, FairnessError, PriorityPolicy, TokenCost, VTCPolicy
from fairness.shared import RemoteService, class_counter, shares_counters, split_class_counter
from tests.defaults import MAX_QUEUE_AGE_S, vtc
from tests.fairness.stand_in import job

TENANTS = ["a", "b", "c"]


def close(x: float, y: float) -> bool:
    return math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-6)


# -- RemoteService -------------------------------------------------------------------------------

observations = st.lists(
    st.tuples(
        st.sampled_from(["e1", "e2", "e3"]),
        st.dictionaries(st.sampled_from(TENANTS), st.floats(0, 1e6), max_size=3),
    ),
    max_size=30,
)


@given(observations)
def test_merged_totals_never_fall_and_sum_each_engines_largest_report(reports: list[Any]) -> None:
    merge = RemoteService()
    largest: dict[str, dict[str, float]] = defaultdict(dict)
    before: dict[str, float] = {}
    for engine, service in reports:
        merge.observe(engine, service)
        for key, value in service.items():
            largest[engine][key] = max(value, largest[engine].get(key, 0.0))
        totals = merge.totals()
        for key, value in before.items():
            assert totals[key] >= value  # a late, reordered or restarted-from-scratch report lowers nothing
        for key in TENANTS:
            expected = sum(per.get(key, 0.0) for per in largest.values())
            assert close(totals.get(key, 0.0), expected)
        before = totals


@pytest.mark.parametrize("value", [-1.0, float("nan"), float("inf")])
def test_a_report_that_is_not_service_is_refused(value: float) -> None:
    with pytest.raises(FairnessError):
        RemoteService().observe("e1", {"a": value})


def test_class_counter_names_round_trip_keys_with_colons() -> None:
    assert split_class_counter(class_counter(2, "org:team:a")) == (2, "org:team:a")
    assert split_class_counter("no-class") is None
    assert split_class_counter("x:a") is None


# -- VTC: two engines, model-checked -----------------------------------------------------------

operation = st.one_of(
    st.tuples(st.just("add"), st.integers(0, 1), st.sampled_from(TENANTS), st.sampled_from([1.0, 2.0, 4.0])),
    st.tuples(st.just("admit"), st.integers(0, 1)),
    st.tuples(
        st.just("charge"), st.integers(0, 1), st.integers(0, 40), st.integers(0, 3), st.integers(0, 99)
    ),
    st.tuples(st.just("decodes"), st.integers(0, 1)),
    st.tuples(st.just("remove"), st.integers(0, 1), st.integers(0, 99)),
    st.tuples(st.just("sync"), st.integers(0, 1)),
)


class Engines:
    """Two VTC policies and a model of what each must hold: its own charges, and the other's as last read."""

    def __init__(self, allowance: float) -> None:
        self.cost = TokenCost(1.0, 2.0, 0.0)
        self.policies = [VTCPolicy[Any](self.cost, lift_allowance=allowance) for _ in range(2)]
        self.merges = [RemoteService(), RemoteService()]
        self.queued: list[list[Any]] = [[], []]
        self.running: list[list[Any]] = [[], []]
        self.weights: list[dict[str, float]] = [{}, {}]
        self.charged: list[dict[str, float]] = [defaultdict(float), defaultdict(float)]
        self.heard: list[dict[str, float]] = [{}, {}]  # the other engine's charged service, as last read
        self.next_id = 0

    def apply(self, op: tuple[Any, ...]) -> None:
        kind, e = op[0], op[1]
        policy = self.policies[e]
        if kind == "add":
            item = job(f"r{self.next_id}", op[2], weight=op[3])
            self.next_id += 1
            policy.add(item, 0.0)
            self.weights[e][op[2]] = op[3]
            self.queued[e].append(item)
        elif kind == "admit" and (item := policy.peek(0.0)) is not None:
            policy.pop(item)
            self.queued[e].remove(item)
            self.running[e].append(item)
        elif kind == "charge" and self.running[e]:
            item = self.running[e][op[4] % len(self.running[e])]
            policy.charge(item, op[2], op[3], 0)
            key = item.meta.tenant_id
            self.charged[e][key] += self.cost(op[2], op[3], 0) / self.weights[e][key]
        elif kind == "decodes" and self.running[e]:
            policy.charge_decodes(self.running[e])
            for item in self.running[e]:
                key = item.meta.tenant_id
                self.charged[e][key] += self.cost(0, 1, 0) / self.weights[e][key]
        elif kind == "remove" and self.queued[e]:
            item = self.queued[e].pop(op[2] % len(self.queued[e]))
            policy.remove(item)  # its key may leave the queue, to be lifted when it comes back
        elif kind == "sync":  # engine e publishes; the other one reads and absorbs
            other = 1 - e
            published = policy.local_service()
            self.merges[other].observe(f"e{e}", published)
            self.policies[other].absorb_remote(self.merges[other].totals())
            self.heard[other] = {k: max(v, self.heard[other].get(k, 0.0)) for k, v in published.items()}

    def check(self, before: list[dict[str, float]]) -> None:
        for e, policy in enumerate(self.policies):
            published, counters, lifts = policy.local_service(), policy.counters(), policy.lifts()
            for key in TENANTS:
                # What is published is exactly the weighted service charged here: lifts never travel.
                assert close(published.get(key, 0.0), self.charged[e].get(key, 0.0))
                # A counter is its own charges + its own lifts + the other's charges (never the other's lifts).
                expected = self.charged[e].get(key, 0.0) + lifts.get(key, 0.0) + self.heard[e].get(key, 0.0)
                assert close(counters.get(key, 0.0), expected), (e, key)
                assert lifts.get(key, 0.0) >= 0
                assert counters.get(key, 0.0) >= before[e].get(key, 0.0)  # counters only grow


@settings(max_examples=150, deadline=None)
@given(st.lists(operation, max_size=60), st.sampled_from([0.0, 8.0, 1024.0]))
def test_counters_are_charges_plus_local_lifts_plus_the_others_charges(
    ops: list[Any], allowance: float
) -> None:
    engines = Engines(allowance)
    for op in ops:
        before = [dict(p.counters()) for p in engines.policies]
        engines.apply(op)
        engines.check(before)


def test_a_big_lift_on_one_engine_is_not_published_to_the_other() -> None:
    one, two = vtc(lift_allowance=0.0), vtc(lift_allowance=0.0)
    hog = job("h1", "hog")
    one.add(hog, 0.0)
    one.pop(hog)
    one.charge(hog, 1000, 0, 0)
    one.add(job("h2", "hog"), 0.0)  # hog backlogged at 1000
    one.add(job("n1", "newcomer"), 0.0)  # lifted to the floor: 1000, none of it served
    assert one.lifts()["newcomer"] == 1000.0
    two.absorb_remote(one.local_service())
    assert two.counters() == {"hog": 1000.0}  # the newcomer's lift stays on engine one


def test_a_key_served_elsewhere_comes_back_with_that_service() -> None:
    """B was served 500 on the other engine: arriving here it queues behind A (100), not ahead of it."""

    def engine_with_a_backlogged() -> VTCPolicy[Any]:
        policy = vtc(lift_allowance=50.0)
        first = job("a1", "A")
        policy.add(first, 0.0)
        policy.pop(first)
        policy.charge(first, 100, 0, 0)
        policy.add(job("a2", "A"), 0.0)
        return policy

    synced, alone = engine_with_a_backlogged(), engine_with_a_backlogged()
    synced.absorb_remote({"B": 500.0})
    for policy in (synced, alone):
        policy.add(job("b1", "B"), 0.0)
    head = synced.peek(0.0)
    assert head is not None and head.request_id == "a2"
    assert synced.counters()["B"] == 500.0
    head = alone.peek(0.0)
    assert head is not None and head.request_id == "b1"  # alone, B is lifted only to 100 - 50


def test_priority_classes_share_per_class_and_edf_forwards() -> None:
    policy = PriorityPolicy[Any](lambda: EDFPolicy(vtc()), MAX_QUEUE_AGE_S)
    item = job("r1", "A", priority=1)
    policy.add(item, 0.0)
    policy.pop(item)
    policy.charge(item, 10, 0, 0)
    assert shares_counters(policy)
    assert policy.local_service() == {"1:A": 10.0}
    policy.absorb_remote({"1:A": 5.0, "0:B": 7.0, "junk": 1.0})
    by_class = policy.counters_by_class()
    assert by_class[1]["A"] == 15.0
    assert by_class[0]["B"] == 7.0  # a class first heard of remotely exists here from now on
