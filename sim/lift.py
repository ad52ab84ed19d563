"""Simulator scenarios for the VTC lift rule (fairness/vtc.py): banked credit and closed-loop weights.

(a) `banked_credit`: tenants A and B stay backlogged; tenant T keeps a few short requests running
    (closed loop, below its share) and then floods. Reported: T's largest lead over the less served of
    A and B, counted from the flood, against the VTC bound 2·max(w_in·L_in, w_out·M).
(b) `closed_loop_weights`: two closed-loop tenants weighted 3:1 with few streams each, more streams
    than seats. Reported: the ratio of the service they received.

Every figure is computed by running the real Scheduler and policy; nothing here is typed in.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from typing import Any

from engine.core.request import Request
from engine.core.scheduler import SchedulerOutput
from fairness.config import FairnessConfig, FairnessKey
from fairness.flows import FlowVTCPolicy
from sim.simulator import SimConfig, SimRequest, Simulator


@dataclass
class BankedCreditSetup:
    """The geometry of scenario (a)."""

    lift_allowance: float = 1024.0
    trickle_until_s: float = 30.0
    trickle_streams: int = 3
    trickle_prompt: int = 10
    trickle_output: int = 20
    prompt: int = 100  # L_in of every request
    output: int = 100
    flood: int = 400
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 512
    num_blocks: int = 256
    block_size: int = 16
    # "tenant": A, B and T are tenants. "tenant/user": they are three users of one tenant, so the lift and
    # the bound are those of the inner level (fairness/flows.py).
    key: FairnessKey = "tenant"

    def config(self) -> SimConfig:
        """The simulated engine (w_in=1, w_out=2, one class)."""
        return SimConfig(
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            num_blocks=self.num_blocks,
            block_size=self.block_size,
            fairness=FairnessConfig(
                lift_allowance=self.lift_allowance,
                key=self.key,
                priority_classes=False,
            ),
        )

    def request(self, name: str, who: str, at: float, prompt: int, output: int) -> SimRequest:
        """A request of `who` (a tenant, or a user of the one tenant "X" under a two-level key)."""
        if self.key == "tenant":
            return SimRequest(name, who, at, prompt, output)
        return SimRequest(name, "X", at, prompt, output, user=who)

    def service(self, sim: Simulator) -> dict[str, float]:
        """Charged service of A, B and T (tenants, or the users of "X")."""
        if self.key == "tenant":
            return dict(sim.service())
        assert isinstance(sim.policy, FlowVTCPolicy), "a two-level key runs the flow policy"
        flows = sim.policy.flow_service()
        return {name.split("/", 1)[1]: value for name, value in flows.items()}

    def vtc_bound(self, w_in: float = 1.0, w_out: float = 2.0) -> float:
        """2·max(w_in·L_in, w_out·M), M the tokens the KV cache can hold."""
        return 2 * max(w_in * self.prompt, w_out * self.num_blocks * self.block_size)


def banked_credit(setup: BankedCreditSetup | None = None) -> dict[str, Any]:
    """Scenario (a): T's largest lead after its flood, and the bound."""
    setup = setup or BankedCreditSetup()
    sim = Simulator(setup.config())
    backlog = [
        setup.request(f"{t}{i}", t, 0.0, setup.prompt, setup.output) for i in range(4000) for t in ("A", "B")
    ]
    names = itertools.count()
    state: dict[str, Any] = {"start": None, "lead": 0.0}
    trickle: list[Request] = []
    flood: list[Request] = []

    def hook(sim: Simulator, out: SchedulerOutput) -> None:
        if sim.clock < setup.trickle_until_s:
            trickle[:] = [r for r in trickle if not r.is_finished]
            for _ in range(setup.trickle_streams - len(trickle)):
                trickle.append(
                    sim.submit(
                        setup.request(
                            f"t{next(names)}", "T", sim.clock, setup.trickle_prompt, setup.trickle_output
                        )
                    )
                )
            return
        service = setup.service(sim)
        if state["start"] is None:
            state["start"] = dict(service)
            flood.extend(
                sim.submit(setup.request(f"f{i}", "T", sim.clock, setup.prompt, setup.output))
                for i in range(setup.flood)
            )
            return
        if flood[-1].first_scheduled_time is not None:
            return  # the flood is admitted: T is no longer backlogged, the bound no longer applies
        start = state["start"]
        gained = {k: service.get(k, 0.0) - start.get(k, 0.0) for k in ("T", "A", "B")}
        state["lead"] = max(state["lead"], gained["T"] - min(gained["A"], gained["B"]))

    sim.run(backlog, until=setup.trickle_until_s + 60.0, on_iteration=hook)
    bound = setup.vtc_bound()
    return {
        "lift_allowance": setup.lift_allowance,
        "lead": state["lead"],
        "bound": bound,
        "lead_over_bound": state["lead"] / bound,
    }


@dataclass
class ClosedLoopSetup:
    """The geometry of scenario (b)."""

    lift_allowance: float = 1024.0
    weights: tuple[float, float] = (3.0, 1.0)
    streams: tuple[int, int] = (3, 4)  # gold's streams just fill its share of the seats: its queue empties
    prompt: int = 50
    output: tuple[int, int] = (10, 100)  # uniform, seeded: requests end at different times
    seed: int = 0
    max_num_seqs: int = 4  # fewer seats than streams: admission decides the split
    max_num_batched_tokens: int = 256
    duration_s: float = 60.0

    def config(self) -> SimConfig:
        """The simulated engine (w_in=1, w_out=2, one class)."""
        return SimConfig(
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            num_blocks=1024,
            fairness=FairnessConfig(lift_allowance=self.lift_allowance),
        )


def closed_loop_weights(setup: ClosedLoopSetup | None = None) -> dict[str, Any]:
    """Scenario (b): the service ratio of two closed-loop tenants weighted `setup.weights`."""
    setup = setup or ClosedLoopSetup()
    sim = Simulator(setup.config())
    names = itertools.count()
    rng = random.Random(setup.seed)
    tenants = {"gold": setup.weights[0], "free": setup.weights[1]}
    streams_of = {"gold": setup.streams[0], "free": setup.streams[1]}

    live: dict[str, list[Request]] = {t: [] for t in tenants}

    def hook(sim: Simulator, out: SchedulerOutput) -> None:
        for tenant, weight in tenants.items():
            streams = live[tenant] = [r for r in live[tenant] if not r.is_finished]
            for _ in range(streams_of[tenant] - len(streams)):
                streams.append(
                    sim.submit(
                        SimRequest(
                            f"{tenant}{next(names)}",
                            tenant,
                            sim.clock,
                            setup.prompt,
                            rng.randint(*setup.output),
                            weight=weight,
                        )
                    )
                )

    sim.run([SimRequest("start", "free", 0.0, 1, 1)], until=setup.duration_s, on_iteration=hook)
    service = sim.service()
    ratio = service["gold"] / service["free"]
    want = setup.weights[0] / setup.weights[1]
    return {
        "lift_allowance": setup.lift_allowance,
        "service": dict(service),
        "ratio": ratio,
        "want": want,
        "error": abs(ratio - want) / want,
    }
