"""VTC: the fairness bound against FCFS, weights, lifting, charging, victims and per-call cost."""

from __future__ import annotations

import random
import sys
from types import FrameType
from typing import Any

import pytest

from fairness import (
    DuplicateItemError,
    FCFSPolicy,
    InvalidChargeError,
    InvalidWeightError,
    TokenCost,
    VTCPolicy,
)
from tests.defaults import COST, fcfs, vtc
from tests.fairness.stand_in import Server, job, random_jobs

MAX_IN, MAX_OUT, CAPACITY = 32, 32, 128


def bound(cost: TokenCost) -> float:
    """Sheng et al., Theorem 4.4: 2·max(w_in·L_in, w_out·M) for two backlogged clients."""
    return 2 * max(cost.w_in * MAX_IN, cost.w_out * CAPACITY)


def worst_gap(policy: Any, seed: int, jobs: int = 150) -> float:
    """Largest |service(a) - service(b)| over steps where both tenants are backlogged (a submits first)."""
    rng = random.Random(seed)
    server = Server(policy, CAPACITY)
    for item in random_jobs("a", jobs, rng, MAX_IN, MAX_OUT) + random_jobs("b", jobs, rng, MAX_IN, MAX_OUT):
        server.submit(item)
    worst = 0.0
    while server.backlogged("a", "b"):
        server.step()
        service = policy.service()
        worst = max(worst, abs(service.get("a", 0.0) - service.get("b", 0.0)))
    return worst


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_vtc_keeps_two_backlogged_tenants_within_the_bound_where_fcfs_does_not(seed: int) -> None:
    cost = COST
    vtc_gap = worst_gap(vtc(cost), seed)
    fcfs_gap = worst_gap(FCFSPolicy(cost), seed)
    assert vtc_gap <= bound(cost)
    # FCFS serves tenant a's whole burst first: the gap grows with the trace, not with the batch.
    assert fcfs_gap > 5 * bound(cost)


def test_bound_holds_with_other_token_prices() -> None:
    cost = TokenCost(w_in=2.0, w_out=1.0, w_cached=0.0)
    assert worst_gap(vtc(cost), seed=7) <= bound(cost)


def run_weighted(policy: VTCPolicy[Any], weights: dict[str, float], steps: int, seed: int = 3) -> Server:
    rng = random.Random(seed)
    server = Server(policy, CAPACITY)
    for tenant, weight in weights.items():
        for item in random_jobs(tenant, 2000, rng, MAX_IN, MAX_OUT, weight=weight):
            server.submit(item)
    for _ in range(steps):
        server.step()
        assert server.backlogged(*weights)
    return server


def test_weighted_shares_converge_to_the_weight_ratio() -> None:
    policy: VTCPolicy[Any] = vtc()
    run_weighted(policy, {"gold": 3.0, "free": 1.0}, steps=4000)
    service = policy.service()
    assert service["gold"] / service["free"] == pytest.approx(3.0, rel=0.05)


def test_set_weight_changes_the_share_live() -> None:
    policy: VTCPolicy[Any] = vtc()
    server = run_weighted(policy, {"gold": 1.0, "free": 1.0}, steps=1000)
    before = policy.service()
    assert before["gold"] / before["free"] == pytest.approx(1.0, rel=0.05)
    policy.set_weight("gold", 4.0)
    for _ in range(4000):
        server.step()
    after = policy.service()
    gained = {key: after[key] - before[key] for key in after}
    assert gained["gold"] / gained["free"] == pytest.approx(4.0, rel=0.05)


def test_idle_tenant_is_lifted_and_cannot_monopolise_when_it_returns() -> None:
    cost = COST
    # An allowance of half the bound (one max request, U) keeps a returning key within the bound.
    policy: VTCPolicy[Any] = VTCPolicy(cost, lift_allowance=bound(cost) / 2)
    rng = random.Random(11)
    server = Server(policy, CAPACITY)
    for item in random_jobs("busy", 600, rng, MAX_IN, MAX_OUT):
        server.submit(item)
    for _ in range(800):
        server.step()
    start = policy.service()
    for item in random_jobs("late", 200, rng, MAX_IN, MAX_OUT):
        server.submit(item)
    # Lifted to the backlogged minimum less the allowance: at most that much credit was kept.
    assert policy.counters()["late"] >= policy.counters()["busy"] - policy.lift_allowance - 1e-9
    while server.backlogged("busy", "late"):
        server.step()
        service = policy.service()
        gap = (service.get("late", 0.0) - start.get("late", 0.0)) - (service["busy"] - start["busy"])
        assert abs(gap) <= bound(cost)


def test_newcomer_is_lifted_to_the_smallest_backlogged_counter_and_never_lowered() -> None:
    policy: VTCPolicy[Any] = VTCPolicy(TokenCost(1.0, 2.0, 0.0), lift_allowance=0.0)  # the paper's lift
    low, high, rich = job("l1", "low"), job("h1", "high"), job("r0", "rich")
    policy.add(rich, 0.0)
    policy.pop(rich)
    policy.charge(rich, 500, 0, 0)  # rich has been served, then went idle
    policy.finish(rich)
    policy.add(low, 0.0)  # nobody backlogged: lifted to rich, the last key to leave (500)
    policy.add(high, 0.0)  # lifted to low, the only backlogged key (500)
    policy.charge(high, 700, 0, 0)
    policy.charge(low, 600, 0, 0)  # low 1100 is now the smallest backlogged counter, high 1200
    policy.add(job("n1", "new"), 0.0)
    policy.add(job("r1", "rich"), 0.0)
    counters = policy.counters()
    assert (counters["low"], counters["high"]) == (1100, 1200)
    assert counters["new"] == 1100
    assert counters["rich"] == 1100  # lifted from 500 to the backlogged minimum
    policy.charge(rich, 1000, 0, 0)  # rich is above everyone now: lifting must not pull it down
    policy.remove(job("r1", "rich"))
    policy.add(job("r2", "rich"), 0.0)
    assert policy.counters()["rich"] == 2100


def test_with_nobody_backlogged_a_newcomer_starts_at_the_last_key_to_leave() -> None:
    policy: VTCPolicy[Any] = vtc(lift_allowance=0.0)
    first = job("a1", "a")
    policy.add(first, 0.0)
    policy.pop(first)  # a leaves the queue but keeps running
    for _ in range(50):
        policy.charge(first, 0, 1, 0)
    policy.add(job("b1", "b"), 1.0)
    assert policy.counters()["b"] == policy.counters()["a"] == 100


def test_long_prefill_is_charged_chunk_by_chunk_so_it_buys_no_free_pass() -> None:
    policy: VTCPolicy[Any] = vtc()
    big, small = job("big", "a"), job("small", "b")
    policy.add(big, 0.0)
    policy.pop(big)
    policy.add(job("a2", "a"), 0.0)
    policy.add(small, 0.0)
    assert policy.peek(0.0) is not None
    policy.charge(big, 64, 0, 0)  # first chunk of a long prompt
    head = policy.peek(0.0)
    assert head is small
    policy.pop(small)
    policy.charge(small, 8, 0, 0)
    policy.charge(big, 64, 0, 0)  # second chunk: a stays behind b
    assert policy.peek(0.0).request_id == "a2"  # type: ignore[union-attr]
    assert policy.service() == {"a": 128.0, "b": 8.0}


def test_weight_divides_the_counter_but_not_the_service() -> None:
    policy: VTCPolicy[Any] = vtc(TokenCost(1.0, 2.0, 0.5))
    item = job("x", "a", weight=4.0)
    policy.add(item, 0.0)
    charged = policy.charge(item, 8, 2, 8)
    assert charged == 8 * 1.0 + 2 * 2.0 + 8 * 0.5
    assert policy.counters()["a"] == pytest.approx(charged / 4.0)
    assert policy.service()["a"] == charged


def test_equal_counters_serve_keys_in_the_order_they_became_backlogged() -> None:
    policy: VTCPolicy[Any] = vtc()
    for tenant in ["z", "m", "a"]:
        policy.add(job(f"{tenant}1", tenant), 0.0)
    order = []
    while (item := policy.peek(0.0)) is not None:
        policy.pop(item)
        order.append(item.meta.tenant_id)
    assert order == ["z", "m", "a"]


def test_a_key_alone_uses_the_whole_engine() -> None:
    steps = {}
    for name, policy in (("vtc", vtc()), ("fcfs", fcfs())):
        rng = random.Random(5)
        server = Server(policy, CAPACITY)
        for item in random_jobs("solo", 100, rng, MAX_IN, MAX_OUT):
            server.submit(item)
        while len(policy) or server.running:
            server.step()
        steps[name] = server.now
    assert steps["vtc"] == steps["fcfs"]


def test_preempted_item_returns_to_the_head_of_its_key() -> None:
    policy: VTCPolicy[Any] = vtc()
    first, second = job("a1", "a"), job("a2", "a")
    policy.add(first, 0.0)
    policy.add(second, 0.0)
    policy.pop(first)
    policy.add(first, 1.0, front=True)
    assert policy.peek(1.0) is first


def test_victim_is_the_latest_request_of_the_most_served_key_in_the_lowest_class() -> None:
    policy: VTCPolicy[Any] = vtc()
    heavy_old = job("h1", "heavy", arrival_time=1.0)
    heavy_new = job("h2", "heavy", arrival_time=2.0)
    light = job("l1", "light", arrival_time=3.0)
    important = job("i1", "heavy", priority=0, arrival_time=4.0)
    for r in (heavy_old, heavy_new, light):
        r.meta.priority = 1
    policy.charge(heavy_old, 100, 0, 0)
    policy.charge(light, 10, 0, 0)
    running = [heavy_old, heavy_new, light, important]
    assert policy.victim(running) is heavy_new
    assert policy.victim([important, light]) is light  # lowest class first, even if less served
    assert policy.victim([important], for_item=job("x", "light", priority=1)) is None
    assert policy.victim([important, heavy_new], for_item=important) is heavy_new
    assert policy.victim([]) is None


def test_bad_input_is_refused_with_a_specific_error() -> None:
    policy: VTCPolicy[Any] = vtc()
    item = job("a1", "a")
    policy.add(item, 0.0)
    with pytest.raises(DuplicateItemError, match="a1"):
        policy.add(item, 0.0)
    with pytest.raises(InvalidWeightError, match="'b'"):
        policy.add(job("b1", "b", weight=0.0), 0.0)
    with pytest.raises(InvalidWeightError):
        policy.set_weight("a", float("nan"))
    with pytest.raises(InvalidChargeError, match="decode"):
        policy.charge(item, 1, -1, 0)
    assert len(policy) == 1


def count_policy_lines(action: Any) -> int:
    """Python lines executed inside fairness/ while running `action` (a deterministic cost measure)."""
    count = 0

    def local(frame: FrameType, event: str, arg: object) -> Any:
        nonlocal count
        if event == "line":
            count += 1
        return local

    def tracer(frame: FrameType, event: str, arg: object) -> Any:
        return (
            local
            if "/fairness/" in frame.f_code.co_filename and "/tests/" not in frame.f_code.co_filename
            else None
        )

    sys.settrace(tracer)
    try:
        action()
    finally:
        sys.settrace(None)
    return count


def steady_state_cost(policy: Any, waiting: int, keys: int, cycles: int = 400) -> float:
    """Average policy lines per admit cycle (peek, pop, charge, add) with `waiting` items over `keys` keys."""
    for i in range(waiting):
        policy.add(job(f"w{i}", f"k{i % keys}"), 0.0)
    serial = [waiting]

    def cycles_of_admission() -> None:
        for _ in range(cycles):
            item = policy.peek(1.0)
            policy.pop(item)
            policy.charge(item, 7, 1, 0)
            n = serial[0] = serial[0] + 1
            policy.add(job(f"w{n}", item.meta.tenant_id), 1.0)

    return count_policy_lines(cycles_of_admission) / cycles


@pytest.mark.parametrize("make", [vtc, fcfs])
def test_admission_cost_does_not_grow_with_ten_times_more_waiting_items(make: Any) -> None:
    small = steady_state_cost(make(), waiting=500, keys=20)
    large = steady_state_cost(make(), waiting=5000, keys=20)
    assert large <= 1.25 * small


def test_vtc_admission_cost_does_not_grow_with_ten_times_more_keys() -> None:
    small = steady_state_cost(vtc(), waiting=2000, keys=20)
    large = steady_state_cost(vtc(), waiting=2000, keys=200)
    assert large <= 1.25 * small


def test_key_with_running_requests_is_lifted_less_its_allowance() -> None:
    """Running requests do not exempt a key from the lift (that banked credit); the allowance, divided by
    its weight, is what it may still trail by, so a weight-3 tenant's streams keep their edge."""
    policy: VTCPolicy[Any] = VTCPolicy(TokenCost(1.0, 2.0, 0.0), lift_allowance=150.0)
    heavy = job("h1", "heavy", weight=3.0)
    light = job("l1", "light")
    policy.add(heavy, 0.0)
    policy.pop(heavy)
    policy.charge(heavy, 300, 0, 0)  # running: counter 100
    policy.add(light, 0.0)
    policy.pop(light)
    policy.charge(light, 300, 0, 0)  # lifted to 100 - 150 (no change) on arrival, then 300
    policy.add(job("l2", "light"), 0.0)  # light backlogged at 300
    policy.charge(heavy, 600, 0, 0)  # heavy's h1 keeps running: 100 + 200 = 300
    policy.charge(light, 300, 0, 0)  # light 600
    policy.add(job("h2", "heavy", weight=3.0), 0.0)  # h1 still running: lifted to 600 - 150/3 = 550
    assert policy.counters()["heavy"] == 550
    assert policy.peek(0.0).request_id == "h2"  # type: ignore[union-attr]
    policy.add(job("x1", "x"), 0.0)  # a weight-1 newcomer: 550 - 150 = 400, below heavy
    assert policy.counters()["x"] == 400


def test_lift_allowance_must_be_finite_and_not_negative() -> None:
    for bad in (-1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="lift_allowance"):
            VTCPolicy(COST, lift_allowance=bad)
