"""Two-level VTC (fairness/flows.py): the bound at each level, Sybil, lifts, victims, shared counters, state."""

from __future__ import annotations

import random
from typing import Any

import pydantic
import pytest

from fairness import FairnessConfig, make_policy
from fairness.flows import FlowVTCPolicy
from fairness.keys import api_key_flow, user_flow
from fairness.priority import PriorityPolicy
from fairness.vtc import VTCPolicy
from tests.defaults import COST, flow_vtc
from tests.fairness.stand_in import Job, Meta, Server, drain, job

MAX_IN, MAX_OUT, CAPACITY = 32, 32, 128
BOUND = 2 * max(COST.w_in * MAX_IN, COST.w_out * CAPACITY)  # Sheng et al. Theorem 4.4, per level


def jobs(tenant: str, users: list[str | None], count: int, rng: random.Random) -> list[Job]:
    """`count` random jobs of `tenant`, round-robin over `users`."""
    return [
        Job(
            f"{tenant}-{i}",
            Meta(tenant_id=tenant, user=users[i % len(users)]),
            rng.randint(1, MAX_IN),
            rng.randint(1, MAX_OUT),
        )
        for i in range(count)
    ]


def flow_service(policy: FlowVTCPolicy[Any], name: str) -> float:
    return policy.flow_service().get(name, 0.0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_each_level_keeps_its_backlogged_keys_within_the_vtc_bound(seed: int) -> None:
    """Tenants a (24 users) and b (1 user): |a - b| <= bound; inside a, two backlogged users stay within it too."""
    rng = random.Random(seed)
    policy: FlowVTCPolicy[Job] = flow_vtc(user_flow, COST)
    server = Server(policy, CAPACITY)
    for item in jobs("a", [f"u{i}" for i in range(24)], 480, rng) + jobs("b", ["solo"], 200, rng):
        server.submit(item)
    outer_gap = inner_gap = 0.0
    while server.backlogged("a", "b"):
        server.step()
        service = policy.service()
        outer_gap = max(outer_gap, abs(service.get("a", 0.0) - service.get("b", 0.0)))
        inner_gap = max(inner_gap, abs(flow_service(policy, "a/u0") - flow_service(policy, "a/u1")))
    assert outer_gap <= BOUND
    assert inner_gap <= BOUND
    # Sybil: 24 names did not buy a 24x share; the flat per-user key does hand it over.
    service = policy.service()
    assert service["a"] / service["b"] == pytest.approx(1.0, rel=0.1)
    flat = make_policy(FairnessConfig(key="user", priority_classes=False))
    rng = random.Random(seed)
    server = Server(flat, CAPACITY)
    for item in jobs("a", [f"u{i}" for i in range(24)], 480, rng) + jobs("b", ["solo"], 200, rng):
        server.submit(item)
    while server.backlogged("a", "b"):
        server.step()
    per_tenant = {"a": 0.0, "b": 0.0}
    for key, value in flat.service().items():
        per_tenant[key.split("/")[0]] += value
    assert per_tenant["a"] > 5 * per_tenant["b"]


def test_a_flow_cannot_hold_back_its_tenants_other_flow() -> None:
    """An agent's 60 queued calls and a chat's 3 in one tenant: the chat is admitted among the first."""
    policy: FlowVTCPolicy[Job] = flow_vtc(user_flow, COST)
    for i in range(60):
        policy.add(job(f"agent-{i}", "a", user="agent"), 0.0)
    for i in range(3):
        policy.add(job(f"chat-{i}", "a", user="chat"), 0.0)
    order = []
    while (item := policy.peek(0.0)) is not None:
        policy.pop(item)
        policy.charge(item, 16, 0, 0)
        order.append(item.request_id)
    assert [order.index(f"chat-{i}") for i in range(3)] == [1, 3, 5]


def test_a_returning_flow_and_a_returning_tenant_are_lifted_to_floor_less_the_allowance() -> None:
    policy: FlowVTCPolicy[Job] = flow_vtc(user_flow, COST, lift_allowance=100.0)
    busy = [job(f"x{i}", "a", user="x") for i in range(3)]
    other = [job(f"b{i}", "b") for i in range(3)]
    for item in busy + other:
        policy.add(item, 0.0)
    for item in (busy[0], other[0]):
        policy.pop(item)
        policy.charge(item, 0, 1000, 0)  # 2000 service units each: a/x and b at 2000
    late = job("y0", "a", user="y")
    policy.add(late, 0.0)
    assert policy.inner("a").counter("y") == pytest.approx(2000.0 - 100.0)  # inner lift
    policy.charge(busy[0], 0, 500, 0)  # a at 3000, b at 2000
    newcomer = job("c0", "c", weight=2.0)
    policy.add(newcomer, 0.0)
    assert policy.counters()["c"] == pytest.approx(2000.0 - 100.0 / 2.0)  # outer lift, by c's weight


def test_victim_is_the_most_served_tenants_most_served_flow_latest_arrival() -> None:
    policy: FlowVTCPolicy[Job] = flow_vtc(user_flow, COST)
    running = [
        job("a-x-early", "a", user="x", arrival_time=1.0),
        job("a-x-late", "a", user="x", arrival_time=2.0),
        job("a-y", "a", user="y", arrival_time=9.0),
        job("b-z", "b", user="z", arrival_time=10.0),
    ]
    for item in running:
        policy.add(item, 0.0)
        policy.pop(item)
    policy.charge(running[0], 0, 300, 0)  # a/x 600
    policy.charge(running[2], 0, 100, 0)  # a/y 200; a 800
    policy.charge(running[3], 0, 350, 0)  # b 700, the flow z alone served more than a/x
    assert policy.victim(running) is running[1]
    # never for an item of a more important class, never the item itself
    urgent = job("urgent", "b", priority=-1)
    assert policy.victim([urgent], for_item=urgent) is None


def test_shared_counters_carry_both_levels_through_priority_classes() -> None:
    config = FairnessConfig(key="tenant/workflow")
    here, there = make_policy(config), make_policy(config)
    assert isinstance(here, PriorityPolicy)
    item = Job("r1", Meta(tenant_id="a"))
    item.meta.workflow_run_id = "run-7"  # type: ignore[attr-defined]
    there.add(item, 0.0)
    there.pop(item)
    there.charge(item, 10, 0, 0)
    published = there.local_service()
    assert published == {"0:a": 10.0, "0:a/run-7": 10.0}
    here.absorb_remote(published)
    base = here._classes[0]
    assert isinstance(base, FlowVTCPolicy)
    assert base.counters()["a"] == pytest.approx(10.0)
    assert base.flow_counters()["a/run-7"] == pytest.approx(10.0)


def test_idle_flows_are_forgotten_and_each_tenant_remembers_at_most_its_cap() -> None:
    policy: FlowVTCPolicy[Job] = flow_vtc(user_flow, COST, lift_allowance=0.0, max_flows_per_tenant=8)
    hog = [job(f"hog-{i}", "a", user="hog") for i in range(400)]
    for item in hog:
        policy.add(item, 0.0)
    for i in range(200):  # one-shot users come, are served, and leave while "hog" stays backlogged
        item = job(f"u{i}", "a", user=f"user-{i}")
        policy.add(item, 0.0)
        for admitted in (policy.peek(0.0), policy.peek(0.0)):
            if admitted is not None and admitted in policy:
                policy.pop(admitted)
                policy.charge(admitted, 8, 0, 0)
                policy.finish(admitted)
        assert policy.flows_known("a") <= 8 + 1
    # Every remembered flow busy: a new name shares the unnamed flow rather than growing the table.
    busy: FlowVTCPolicy[Job] = flow_vtc(user_flow, COST, max_flows_per_tenant=4)
    for i in range(10):
        busy.add(job(f"b{i}", "a", user=f"user-{i}"), 0.0)
    assert busy.flows_known("a") <= 4 + 1
    assert busy.inner("a").waiting()[""] == 10 - 4


def test_a_forgotten_flow_returns_lifted_and_its_published_total_never_drops() -> None:
    policy: FlowVTCPolicy[Job] = flow_vtc(user_flow, COST, lift_allowance=50.0, max_flows_per_tenant=2)
    first = job("q0", "a", user="quiet")
    policy.add(first, 0.0)
    policy.pop(first)
    policy.charge(first, 40, 0, 0)
    policy.finish(first)
    hogs = [job(f"h{i}", "a", user="hog") for i in range(50)]
    for item in hogs:
        policy.add(item, 0.0)
    drain(policy)
    for item in hogs:
        policy.charge(item, 40, 0, 0)
        policy.finish(item)
    policy.add(job("n0", "a", user="newcomer"), 0.0)  # at the cap: the least served idle flow goes
    assert not policy.inner("a").holds("quiet")
    back = job("q1", "a", user="quiet")
    policy.add(back, 0.0)
    assert policy.inner("a").counter("quiet") == pytest.approx(policy.inner("a").counter("newcomer") - 50.0)
    assert policy.local_service()["a/quiet"] >= 40.0


def test_per_api_key_weights_divide_the_tenants_share() -> None:
    policy: FlowVTCPolicy[Job] = flow_vtc(api_key_flow, COST)
    policy.set_weight("a/k-heavy", 3.0)
    server = Server(policy, CAPACITY)
    for i in range(600):
        server.submit(job(f"h{i}", "a", api_key_id="k-heavy"))
        server.submit(job(f"l{i}", "a", api_key_id="k-light"))
    for _ in range(400):
        server.step()
    service = policy.flow_service()
    assert service["a/k-heavy"] / service["a/k-light"] == pytest.approx(3.0, rel=0.1)


def test_two_level_keys_are_accepted_and_others_refused_naming_the_field() -> None:
    for key in ("tenant/user", "tenant/workflow", "tenant/api_key"):
        policy = make_policy(FairnessConfig(key=key, priority_classes=False))
        assert isinstance(policy, FlowVTCPolicy)
    assert isinstance(make_policy(FairnessConfig(key="user", priority_classes=False)), VTCPolicy)
    with pytest.raises(pydantic.ValidationError, match="key"):
        FairnessConfig(key="tenant/nonsense")  # type: ignore[arg-type]
    with pytest.raises(pydantic.ValidationError, match="max_flows_per_tenant"):
        FairnessConfig(max_flows_per_tenant=0)


def test_under_edf_and_priority_classes_a_running_flow_stays_remembered() -> None:
    policy = make_policy(FairnessConfig(key="tenant/user", edf=True, max_flows_per_tenant=1))
    running = job("r0", "a", user="busy")
    policy.add(running, 0.0)
    assert policy.peek(0.0) is running
    policy.pop(running)
    policy.charge(running, 8, 0, 0)
    base = policy._classes[0].base  # priority class 0, under EDF: the two-level VTC
    policy.add(job("n0", "a", user="newcomer"), 0.0)  # at the cap, but "busy" runs: it is not forgotten
    assert base.inner("a").holds("busy")
    assert base.inner("a").waiting() == {"": 1}  # the newcomer shares the unnamed flow instead
    policy.finish(running)
