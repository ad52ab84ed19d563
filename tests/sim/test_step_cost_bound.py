"""VTC's bound restated for the step cost model (docs/fairness.md, "The step's cost"), in the simulator.

The two-tenant trace of tests/engine/test_fair_scheduler.py with the budget and the charge priced by a step
cost model: X's short requests and Y's long ones attend over very different contexts, so the charge per new
token differs by tenant; the service difference must stay within 2·max(w_in·Ĉ_in, M·(w_out + w_in·(σ + κ)))
at every iteration, and the service stays split evenly.
"""

from __future__ import annotations

from engine.core.request import RequestState
from engine.core.scheduler import SchedulerOutput
from engine.core.step_cost import StepCost
from sim.scenarios import TwoTenantSetup
from sim.simulator import Simulator

MODEL = StepCost(context=0.003, sequence=12.0)
SETUP = TwoTenantSetup(duration_s=40.0, max_num_seqs=32, num_blocks=256, sample_every_s=1.0, step_cost=MODEL)


def _run(policy: str) -> tuple[list[float], Simulator]:
    diffs: list[float] = []

    def record(sim: Simulator, _: SchedulerOutput) -> None:
        service = sim.policy.service()
        diffs.append(abs(service.get("X", 0.0) - service.get("Y", 0.0)))

    sim = Simulator(SETUP.config(policy))
    sim.run(SETUP.workload(), until=SETUP.duration_s, on_iteration=record)
    return diffs, sim


def test_vtc_keeps_two_backlogged_tenants_within_the_restated_bound_under_the_step_cost() -> None:
    diffs, sim = _run("vtc")
    waiting = {
        r.meta.tenant_id for r in sim.scheduler.requests.values() if r.state is not RequestState.RUNNING
    }
    assert waiting == {"X", "Y"}, "both tenants must stay backlogged for the bound to apply"
    service = sim.policy.service()
    assert min(service.values()) > 2 * SETUP.vtc_bound(), "the run must be long compared with the bound"
    assert max(diffs) <= SETUP.vtc_bound()
    # The charge is the model's: Y's 1,000-token prompts attend over far more context per token than X's.
    plain = TwoTenantSetup(duration_s=40.0, max_num_seqs=32, num_blocks=256)
    assert SETUP.vtc_bound() > plain.vtc_bound()


def test_fcfs_breaks_the_restated_bound_on_the_same_trace() -> None:
    diffs, _ = _run("fcfs")
    assert max(diffs) > SETUP.vtc_bound()
