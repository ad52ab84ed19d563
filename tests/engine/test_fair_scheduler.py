"""Fair share through the real Scheduler, driven by the simulator's virtual clock.

The policy-level versions of these properties live in tests/fairness; here the same properties must
survive chunked prefill, KV-block limits, preemption and the scheduler's charging.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.kv_cache import BlockPool
from engine.core.policy import build_policy
from engine.core.request import FinishReason, Request, RequestMeta, RequestState
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import Scheduler, SchedulerOutput
from engine.core.step_cost import StepCost
from fairness import FairnessConfig
from sim.scenarios import TwoTenantSetup
from sim.simulator import SimConfig, SimRequest, Simulator
from tests.defaults import scheduler_config

# Small enough to run in a second or two, large enough for many Y requests to finish.
SETUP = TwoTenantSetup(duration_s=25.0, max_num_seqs=32, num_blocks=256, sample_every_s=1.0)


def _differences(policy: str, setup: TwoTenantSetup = SETUP) -> tuple[list[float], Simulator]:
    """Run the two-tenant trace and return the X/Y service difference after every iteration."""
    diffs: list[float] = []

    def record(sim: Simulator, _: SchedulerOutput) -> None:
        service = sim.policy.service()
        diffs.append(abs(service.get("X", 0.0) - service.get("Y", 0.0)))

    sim = Simulator(setup.config(policy))
    sim.run(setup.workload(), until=setup.duration_s, on_iteration=record)
    return diffs, sim


def _backlogged(sim: Simulator) -> set[str]:
    return {r.meta.tenant_id for r in sim.scheduler.requests.values() if r.state is not RequestState.RUNNING}


def test_vtc_keeps_two_backlogged_tenants_within_the_bound_at_every_iteration() -> None:
    diffs, sim = _differences("vtc")
    assert _backlogged(sim) == {"X", "Y"}, "both tenants must stay backlogged for the bound to apply"
    service = sim.policy.service()
    assert min(service.values()) > 2 * SETUP.vtc_bound(), "the run must be long compared with the bound"
    assert len(diffs) > 500
    assert max(diffs) <= SETUP.vtc_bound()


def test_fcfs_breaks_the_same_bound_on_the_same_trace() -> None:
    diffs, sim = _differences("fcfs")
    assert _backlogged(sim) == {"X", "Y"}
    assert max(diffs) > SETUP.vtc_bound()


def test_weights_three_to_one_converge_to_a_three_to_one_service_ratio() -> None:
    setup = TwoTenantSetup(duration_s=40.0, max_num_seqs=32, num_blocks=256, y_prompt=10, y_output=10)
    sim = Simulator(setup.config("vtc"))
    sim.run(setup.workload(x_weight=3.0, y_weight=1.0), until=setup.duration_s)
    assert _backlogged(sim) == {"X", "Y"}
    service = sim.policy.service()
    assert math.isclose(service["X"] / service["Y"], 3.0, rel_tol=0.05)


def test_a_tenant_returning_from_idle_is_lifted_and_cannot_monopolise() -> None:
    late = 10.0
    workload = [SimRequest(f"a{i}", "A", 0.0, 50, 50) for i in range(4000)]
    workload += [SimRequest(f"b{i}", "B", late, 50, 50) for i in range(4000)]
    config = SimConfig(
        max_num_seqs=16, max_num_batched_tokens=256, num_blocks=256, fairness=FairnessConfig(policy="vtc")
    )
    bound = 2 * max(1.0 * 50, 2.0 * config.num_blocks * config.block_size)
    at_arrival: dict[str, float] = {}
    gains: list[float] = []

    def record(sim: Simulator, _: SchedulerOutput) -> None:
        service = sim.policy.service()
        if sim.clock < late:
            return
        if not at_arrival:
            at_arrival.update(A=service["A"], B=service.get("B", 0.0))
        gains.append((service.get("B", 0.0) - at_arrival["B"]) - (service["A"] - at_arrival["A"]))

    sim = Simulator(config)
    sim.run(workload, until=late + 20.0, on_iteration=record)
    assert _backlogged(sim) == {"A", "B"}
    # A banked far more than the bound while B was idle; without lifting B would take everything.
    assert at_arrival["A"] > 5 * bound
    assert max(gains) <= bound
    assert sim.policy.service()["B"] > bound, "B must be served once it arrives"


def test_a_higher_class_is_never_preempted_for_a_lower_one() -> None:
    config = SimConfig(
        max_num_seqs=8,
        max_num_batched_tokens=128,
        num_blocks=40,
        block_size=4,
        fairness=FairnessConfig(policy="vtc"),
    )
    workload = [
        SimRequest(
            f"r{i}", f"t{i % 3}", arrival=0.001 * i, prompt_tokens=12, output_tokens=30, priority=i % 2
        )
        for i in range(60)
    ]
    victims: list[int] = []

    def check(_: Simulator, out: SchedulerOutput) -> None:
        for victim, record in out.preempted:
            victims.append(victim.meta.priority)
            assert record.reason == "kv_blocks_exhausted"
            # Anything that still ran this iteration is at least as important as the victim.
            assert all(c.request.meta.priority <= victim.meta.priority for c in out.chunks), (
                f"class {victim.meta.priority} preempted while a lower class ran"
            )

    sim = Simulator(config)
    result = sim.run(workload, on_iteration=check)
    assert len(result.completions) == 60
    assert 1 in victims, "the trace must put memory under pressure"
    assert victims.count(1) > victims.count(0)
    assert sim.pool.num_free == sim.pool.num_blocks


def _promotion_run(max_queue_age_s: float) -> tuple[float, float]:
    """A class-1 request behind a class-0 backlog: (its admission time, when the backlog was last admitted)."""
    config = SimConfig(
        max_num_seqs=4,
        max_num_batched_tokens=64,
        num_blocks=128,
        block_size=4,
        fairness=FairnessConfig(policy="vtc", max_queue_age_s=max_queue_age_s),
    )
    workload = [SimRequest(f"h{i}", "busy", 0.0, 8, 20, priority=0) for i in range(300)]
    workload.append(SimRequest("low", "quiet", 0.0, 8, 5, priority=1))
    result = Simulator(config).run(workload)
    done = result.completions
    last_high = max(c.first_scheduled or 0.0 for n, c in done.items() if n != "low")
    low = done["low"].first_scheduled
    assert low is not None and len(done) == 301
    return low, last_high


def test_aging_promotes_a_waiting_lower_class_request() -> None:
    low, last_high = _promotion_run(max_queue_age_s=2.0)
    assert 2.0 <= low < last_high / 2, "promoted after the maximum queue age, long before the backlog drains"
    starved, last_high_inf = _promotion_run(max_queue_age_s=math.inf)
    assert starved >= last_high_inf, "without aging the lower class waits for the whole backlog"


def test_edf_setting_orders_a_class_by_deadline() -> None:
    def admission_order(edf: bool) -> list[str]:
        config = SimConfig(max_num_seqs=1, fairness=FairnessConfig(policy="vtc", edf=edf))
        workload = [
            SimRequest(
                f"d{i}", f"t{i}", arrival=0.001 * i, prompt_tokens=4, output_tokens=3, deadline=1000.0 - i
            )
            for i in range(5)
        ]
        result = Simulator(config).run(workload)
        return sorted(result.completions, key=lambda n: result.completions[n].first_scheduled or 0.0)

    assert admission_order(edf=False)[1:] == ["d1", "d2", "d3", "d4"]
    assert admission_order(edf=True) == [
        "d0",
        "d4",
        "d3",
        "d2",
        "d1",
    ]  # d0 was running before the others came


def test_a_lower_class_decode_does_not_take_the_block_a_higher_class_prefill_needs() -> None:
    # Four blocks of four. L (class 1) decodes while H (class 0) prefills a 12-token prompt in
    # 4-token chunks; when the pool runs dry H needs a block. Scheduling L's decode first would leave
    # H no candidate but itself; the scheduler must order by class and preempt L instead.
    scheduler = Scheduler(
        scheduler_config(max_num_batched_tokens=4, max_num_seqs=4, max_model_len=256),
        BlockPool(4, 4, enable_prefix_caching=False),
        build_policy(FairnessConfig()),
    )

    def request(rid: str, prompt: int, output: int, priority: int) -> Request:
        meta = RequestMeta(tenant_id=rid, priority=priority, arrival_time=0.0)
        return Request(rid, [1] * prompt, SamplingParams(max_tokens=output, ignore_eos=True), meta)

    low, high = request("L", 3, 10, priority=1), request("H", 12, 3, priority=0)  # H fits in 4 blocks
    scheduler.add(low, 0.0)
    preempted: list[str] = []
    for step in range(40):
        if step == 1:
            scheduler.add(high, 0.0)
        out = scheduler.schedule(float(step))
        preempted += [victim.request_id for victim, _ in out.preempted]
        scheduler.update(out, {c.request.request_id: 5 for c in out.chunks}, set(), now=float(step))
        scheduler.pool.check_invariants()
    assert preempted and set(preempted) == {"L"}
    assert high.preemptions == [] and len(high.output_token_ids) == 3
    assert len(low.output_token_ids) == 10 and not scheduler.has_unfinished()


def test_the_policy_hears_of_each_finished_request_once() -> None:
    policy = build_policy(FairnessConfig())
    finished: list[str] = []
    original = policy.finish

    def counting_finish(item: Request) -> None:
        finished.append(item.request_id)
        original(item)

    policy.finish = counting_finish  # type: ignore[method-assign]
    scheduler = Scheduler(
        scheduler_config(max_num_batched_tokens=16, max_num_seqs=4, max_model_len=256),
        BlockPool(16, 4, enable_prefix_caching=False),
        policy,
    )
    done = Request("done", [1] * 4, SamplingParams(max_tokens=2, ignore_eos=True), RequestMeta(tenant_id="a"))
    dropped = Request(
        "dropped", [1] * 4, SamplingParams(max_tokens=9, ignore_eos=True), RequestMeta(tenant_id="b")
    )
    scheduler.add(done, 0.0)
    scheduler.add(dropped, 0.0)
    for step in range(10):
        out = scheduler.schedule(float(step))
        scheduler.update(out, {c.request.request_id: 5 for c in out.chunks}, set(), now=float(step))
        if done.is_finished:
            break
    scheduler.finish(dropped, FinishReason.CANCELLED, 10.0)
    assert sorted(finished) == ["done", "dropped"]


@settings(max_examples=40, deadline=None)
@given(
    prompts=st.lists(st.integers(1, 2047), min_size=1, max_size=62),
    outputs=st.integers(1, 24),
    served_steps=st.integers(1, 12),
)
def test_a_short_request_of_an_under_served_tenant_starts_within_one_step_whatever_b_has_in_flight(
    prompts: list[int], outputs: int, served_steps: int
) -> None:
    """Issue 45: B's admitted prompts (any number, any length, part-prefilled or decoding) do not keep the step's
    budget from A, who is served less: A's 100-token prompt runs whole in the very next step, beside every
    running decode (none is starved for it)."""
    scheduler = Scheduler(
        scheduler_config(max_model_len=4096), BlockPool(16384, 16, False), build_policy(FairnessConfig())
    )
    for i, length in enumerate(prompts):
        meta = RequestMeta(tenant_id="B", arrival_time=0.0)
        scheduler.add(
            Request(f"b{i}", [1] * length, SamplingParams(max_tokens=outputs, ignore_eos=True), meta)
        )
    for step in range(served_steps):
        out = scheduler.schedule(float(step))
        scheduler.update(out, {c.request.request_id: 5 for c in out.chunks}, set(), now=float(step))
    decoding = {r.request_id for r in scheduler.running if r.output_token_ids}
    short = Request(
        "a", [1] * 100, SamplingParams(max_tokens=1), RequestMeta(tenant_id="A", arrival_time=1.0)
    )
    scheduler.add(short, float(served_steps))
    out = scheduler.schedule(float(served_steps))
    ran = {c.request.request_id: (c.start, c.length) for c in out.chunks}
    assert ran["a"] == (0, 100)
    assert decoding <= ran.keys()
    assert out.num_batched_tokens <= scheduler.config.max_num_batched_tokens


def test_a_running_prompt_goes_before_its_own_tenants_queue_so_a_flood_does_not_spread() -> None:
    """Within a key the prompt already under way continues first: B's queue is not admitted chunk by chunk."""
    scheduler = Scheduler(scheduler_config(), BlockPool(4096, 16, False), build_policy(FairnessConfig()))
    for i in range(8):
        meta = RequestMeta(tenant_id="B", arrival_time=0.0)
        scheduler.add(Request(f"b{i}", [1] * 2047, SamplingParams(max_tokens=1, ignore_eos=True), meta))
    most = 0
    for step in range(80):  # 8 × 2,047 tokens at the default 256-token budget: 64 steps
        out = scheduler.schedule(float(step))
        prompts = [c for c in out.chunks if not c.samples or c.start < c.request.num_prompt_tokens]
        most = max(most, len(prompts))
        scheduler.update(out, {c.request.request_id: 5 for c in out.chunks}, set(), now=float(step))
    assert most == 2  # one prompt's last chunk and the next one's first, never more
    assert not scheduler.has_unfinished()


def test_the_lift_allowance_keeps_its_meaning_when_the_step_cost_charges_a_sequence_constant() -> None:
    """The allowance is "one 512-token answer" in plain tokens' service; with the sequence's constant on
    every sampled token (12 new tokens on CPU) an answer token costs (w_out + 12·w_in) / w_out = 7 times
    as much, so a returning key may trail the backlogged minimum by 7 × 1024 / its weight, not 1024."""

    def item(tenant: str, weight: float) -> Request:
        meta = RequestMeta(tenant_id=tenant, weight=weight, arrival_time=0.0)
        return Request(f"{tenant}-1", [1] * 4, SamplingParams(max_tokens=4, ignore_eos=True), meta)

    for step_cost, trail in ((StepCost(sequence=12.0), 7 * 1024 / 4), (None, 1024 / 4)):
        policy = build_policy(FairnessConfig(lift_allowance=1024.0), step_cost=step_cost)
        busy, back = item("busy", 1.0), item("back", 4.0)
        policy.add(busy, 0.0)
        policy.charge(busy, 20_000, 0, 0)  # the backlogged key is far ahead
        policy.add(back, 0.0)  # the returning key is lifted to the minimum less the allowance
        counters = policy.counters()
        assert counters["busy"] - counters["back"] == pytest.approx(trail)
