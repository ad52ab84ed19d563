"""Named simulator scenarios: the essay's token-step trace, its two-tenant fairness case, and a scale run.

Every figure is computed by running the Scheduler in the simulator; nothing here is typed in.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from engine.core.step_cost import TOKENS_ONLY, StepCost
from fairness import FairnessConfig
from sim.simulator import CostModel, SimConfig, SimRequest, SimResult, Simulator

# The essay's trace: two slots, prefills complete, (name, arrival step, output steps).
ESSAY_TRACE = (("A", 0, 8), ("B", 0, 2), ("C", 1, 3), ("D", 3, 1))
ESSAY_SLOTS = 2


def essay_run(static: bool) -> tuple[SimResult, int]:
    """Run the essay trace, one token step per iteration; returns the result and the slot count."""
    config = SimConfig(
        max_num_seqs=ESSAY_SLOTS,
        max_num_batched_tokens=64,
        num_blocks=64,
        request_batching=static,
        cost=CostModel(a=1.0, b=0.0, c=0.0),
    )
    # A one-token prompt completes its prefill in the iteration that samples the first token,
    # so "needs N output steps" is exactly N iterations of one slot.
    workload = [
        SimRequest(name, arrival=float(at), prompt_tokens=1, output_tokens=steps)
        for name, at, steps in ESSAY_TRACE
    ]
    return Simulator(config).run(workload), ESSAY_SLOTS


def essay_scenario() -> dict[str, Any]:
    """Completion steps, mean flow time and slot occupancy under static and continuous batching."""
    report: dict[str, Any] = {}
    for name, static in (("static", True), ("continuous", False)):
        result, slots = essay_run(static)
        done = {c.name: c for c in result.completions.values()}
        steps = {n: round(done[n].finished) for n, _, _ in ESSAY_TRACE}
        flows = [done[n].finished - done[n].arrival for n, _, _ in ESSAY_TRACE]
        positions = result.iterations * slots
        report[name] = {
            "completion_steps": steps,
            "mean_flow_time": sum(flows) / len(flows),
            "useful_request_steps": result.request_iterations,
            "slot_positions": positions,
            "occupancy": result.request_iterations / positions,
        }
    return report


@dataclass
class TwoTenantSetup:
    """The essay's fairness case: X sends many 20-token requests, Y sends 2,000-token requests."""

    duration_s: float = 60.0
    x_prompt: int = 10
    x_output: int = 10
    y_prompt: int = 1000
    y_output: int = 1000
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    num_blocks: int = 2048
    block_size: int = 16
    sample_every_s: float = 5.0
    step_cost: StepCost = TOKENS_ONLY  # the budget's and the charge's model (engine/core/step_cost.py)

    def config(self, policy: str) -> SimConfig:
        """The simulated engine for `policy` (w_in=1, w_out=2, one class)."""
        return SimConfig(
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            num_blocks=self.num_blocks,
            block_size=self.block_size,
            fairness=FairnessConfig(policy=policy),
            step_cost=self.step_cost,
        )

    def workload(self, x_weight: float = 1.0, y_weight: float = 1.0) -> list[SimRequest]:
        """Enough requests from both tenants, all queued at t=0 in alternating order, to stay backlogged."""
        # The cost model caps throughput at 1/b tokens per simulated second; queue that much per tenant.
        tokens = int(self.duration_s / CostModel().b) + 1
        x_count = tokens // (self.x_prompt + self.x_output) + 1
        y_count = tokens // (self.y_prompt + self.y_output) + 1
        out: list[SimRequest] = []
        for i in range(max(x_count, y_count)):
            if i < x_count:
                out.append(SimRequest(f"x{i}", "X", 0.0, self.x_prompt, self.x_output, weight=x_weight))
            if i < y_count:
                out.append(SimRequest(f"y{i}", "Y", 0.0, self.y_prompt, self.y_output, weight=y_weight))
        return out

    def capacity_tokens(self) -> int:
        """M: tokens the KV cache (and so a running batch) can hold."""
        return self.num_blocks * self.block_size

    def vtc_bound(self, w_in: float = 1.0, w_out: float = 2.0) -> float:
        """Sheng et al.'s bound on the service difference of two backlogged clients, for the step cost
        model (docs/fairness.md, "The step's cost"): 2·max(w_in·Ĉ_in, M·(w_out + w_in·(σ + κ))), Ĉ_in the
        model's cost of the longest prompt, σ and κ its coefficients; 2·max(w_in·L_in, w_out·M) for
        new tokens only."""
        cost, capacity = self.step_cost, self.capacity_tokens()
        prompt = cost.chunk(0, self.y_prompt) if not cost.counts_tokens_only else self.y_prompt
        return 2 * max(w_in * prompt, capacity * (w_out + w_in * (cost.sequence + cost.context)))


def two_tenants_scenario(setup: TwoTenantSetup | None = None) -> dict[str, Any]:
    """Service per tenant over time and the maximum service difference, under fcfs and vtc."""
    setup = setup or TwoTenantSetup()
    report: dict[str, Any] = {"bound": setup.vtc_bound(), "duration_s": setup.duration_s}
    for policy in ("fcfs", "vtc"):
        result = Simulator(setup.config(policy)).run(
            setup.workload(), until=setup.duration_s, service_every=setup.sample_every_s, track_service=True
        )
        final = result.service_samples[-1][1] if result.service_samples else {}
        report[policy] = {
            "service": {tenant: final.get(tenant, 0.0) for tenant in ("X", "Y")},
            "service_over_time": [
                {"t": round(t, 3), **{k: s.get(k, 0.0) for k in ("X", "Y")}}
                for t, s in result.service_samples
            ],
            "max_service_difference": result.max_service_difference,
            "output_tokens_per_s": result.output_tokens / result.clock if result.clock else 0.0,
            "batched_tokens_per_s": result.batched_tokens / result.clock if result.clock else 0.0,
        }
    return report


def scale_workload(
    requests: int,
    tenants: int,
    seed: int = 0,
    prompt: tuple[int, int] = (20, 100),
    output: tuple[int, int] = (50, 150),
) -> list[SimRequest]:
    """`requests` requests of ~100 output tokens from `tenants` tenants, all queued at t=0."""
    rng = random.Random(seed)
    return [
        SimRequest(f"r{i}", f"t{rng.randrange(tenants)}", 0.0, rng.randint(*prompt), rng.randint(*output))
        for i in range(requests)
    ]


def scale_scenario(
    requests: int = 100_000,
    tenants: int = 1000,
    max_num_seqs: int = 256,
    policy: str = "vtc",
    seed: int = 0,
    max_iterations: int | None = None,
) -> dict[str, Any]:
    """Run a large backlog and report the simulator's own speed in request-iterations per wall second."""
    config = SimConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max(2048, 8 * max_num_seqs),
        num_blocks=max(8192, 32 * max_num_seqs),
        fairness=FairnessConfig(policy=policy),
    )
    result = Simulator(config).run(scale_workload(requests, tenants, seed), max_iterations=max_iterations)
    return {
        "policy": policy,
        "requests": requests,
        "tenants": tenants,
        "max_num_seqs": max_num_seqs,
        "completed": len(result.completions),
        "iterations": result.iterations,
        "request_iterations": result.request_iterations,
        "wall_seconds": result.wall_seconds,
        "intake_seconds": result.intake_seconds,
        "seconds_per_iteration": result.seconds_per_iteration,
        "request_iterations_per_s": result.rate,
        "simulated_seconds": result.clock,
        "output_tokens_per_simulated_s": result.output_tokens / result.clock if result.clock else 0.0,
    }
