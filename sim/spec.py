"""What a simulation is given and what it returns: the workload's requests, the engine's budgets and cost
model, and the per-request completions and run totals (sim/simulator.py runs them)."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.core.request import FinishReason
from engine.core.step_cost import TOKENS_ONLY, StepCost
from fairness import FairnessConfig


class SimulationError(ValueError):
    """A simulator configuration or workload that cannot run; the message names the field."""


@dataclass
class CostModel:
    """Iteration seconds = a + b·(tokens in the batch) + c·(context tokens the batch attends over)."""

    a: float = 0.004
    b: float = 0.00005
    c: float = 0.0000002

    def seconds(self, batched_tokens: int, context_tokens: int) -> float:
        """Duration of one iteration."""
        return self.a + self.b * batched_tokens + self.c * context_tokens


@dataclass
class SimConfig:
    """Budgets, cache geometry, policy and cost model of one simulated engine."""

    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    max_model_len: int = 1 << 20
    num_blocks: int = 8192
    block_size: int = 16
    enable_prefix_caching: bool = False  # simulated prompts are placeholders, so hits would be fiction
    watermark_blocks: int = 0
    preemption_mode: str = "recompute"  # recompute | swap
    swap_space_blocks: int = 1024  # bounded host buffer, in blocks
    bytes_per_block: int = 2 * 22 * 16 * 4 * 64 * 2  # k+v · layers · block · kv heads · head dim · fp16
    request_batching: bool = False  # static request-level batches (admit only into an empty batch)
    fairness: FairnessConfig = field(default_factory=FairnessConfig)
    cost: CostModel = field(default_factory=CostModel)
    max_idle_iterations: int = 10_000  # consecutive empty iterations before the run is declared stalled
    async_scheduling: bool = False  # schedule step N+1 while step N "runs" (engine/core/async_scheduler.py)
    # The step cost model of the budget and the charge (engine/core/step_cost.py); new tokens only by default.
    step_cost: StepCost = TOKENS_ONLY

    def validate(self) -> None:
        """Raise SimulationError naming the first bad setting."""
        for name in ("max_num_batched_tokens", "max_num_seqs", "max_model_len", "num_blocks", "block_size"):
            if getattr(self, name) < 1:
                raise SimulationError(f"{name} must be >= 1")
        if self.preemption_mode not in ("recompute", "swap"):
            raise SimulationError("preemption_mode must be recompute or swap")
        if self.watermark_blocks < 0 or self.swap_space_blocks < 0:
            raise SimulationError("watermark_blocks and swap_space_blocks must be >= 0")
        if min(self.cost.a, self.cost.b, self.cost.c) < 0 or self.cost.seconds(1, 1) <= 0:
            raise SimulationError("cost model constants must be >= 0 and give a positive iteration time")


@dataclass
class SimRequest:
    """One request of a simulated workload: who sends it, when, and how many tokens in and out."""

    name: str
    tenant: str = "default"
    arrival: float = 0.0
    prompt_tokens: int = 1
    output_tokens: int = 1
    priority: int = 0
    weight: float = 1.0
    deadline: float | None = None
    stop_after: int | None = None  # its token at this output position is a stop token (ends it early)
    user: str | None = None  # a flow of a two-level fairness key (fairness/flows.py)
    workflow_run_id: str | None = None


@dataclass(slots=True)
class Completion:
    """What became of a simulated request."""

    name: str
    tenant: str
    arrival: float
    first_scheduled: float | None
    first_token: float | None
    finished: float
    reason: FinishReason
    output_tokens: int
    preemptions: int
    recomputed_tokens: int
    charged: float = 0.0  # service the policy was charged for it (what its ledger row would carry)


@dataclass
class SimResult:
    """Totals of one run plus per-request completions and (optionally) sampled service per tenant."""

    iterations: int = 0
    clock: float = 0.0
    request_iterations: int = 0  # one running request advanced by one iteration
    batched_tokens: int = 0
    output_tokens: int = 0
    wall_seconds: float = 0.0
    intake_seconds: float = 0.0  # part of wall_seconds spent building and queueing arrivals
    completions: dict[str, Completion] = field(default_factory=dict)
    service_samples: list[tuple[float, dict[str, float]]] = field(default_factory=list)
    max_service_difference: float = 0.0
    preemptions: int = 0
    swapped_bytes: int = 0
    recomputed_tokens: int = 0
    deadline_misses: dict[str, int] = field(default_factory=dict)
    deadline_wasted_tokens: int = 0
    block_waits: int = 0

    @property
    def rate(self) -> float:
        """Simulated request-iterations per second of wall time."""
        return self.request_iterations / self.wall_seconds if self.wall_seconds > 0 else 0.0

    @property
    def seconds_per_iteration(self) -> float:
        """Wall seconds per iteration, arrivals excluded (what must not grow with the backlog)."""
        return (self.wall_seconds - self.intake_seconds) / self.iterations if self.iterations else 0.0
