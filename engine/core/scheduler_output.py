"""The data a scheduler iteration produces: its budgets, the chunks it scheduled, what it preempted."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from engine.core.request import Preemption, Request
from engine.core.step_cost import TOKENS_ONLY, StepCost


@dataclass
class SchedulerConfig:
    """The budgets one iteration must respect; their defaults live in the settings tree (EngineConfig)."""

    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int
    watermark_blocks: int
    preemption_mode: str
    # Static request-level batching (the essay's "photograph"): admit only when the batch is empty.
    request_batching: bool = False
    # What a chunk costs in the step's budget and (with `charge_step_work`) in the fair-share charge
    # (engine/core/step_cost.py). The default counts new tokens only; a served engine sets its own (engine/serving/parts.py).
    step_cost: StepCost = TOKENS_ONLY
    charge_step_work: bool = False


@dataclass(slots=True)
class ScheduledChunk:
    """`length` tokens of `request`, starting at position `start`, computed this iteration."""

    request: Request
    start: int
    length: int

    @property
    def samples(self) -> bool:
        """True when this chunk reaches the end of the request's tokens, so a token is sampled."""
        return self.start + self.length == self.request.num_tokens


@dataclass
class SchedulerOutput:
    """What one iteration runs, plus what the scheduler ended or preempted while deciding."""

    iteration: int
    chunks: list[ScheduledChunk] = field(default_factory=list)
    preempted: list[tuple[Request, Preemption]] = field(default_factory=list)
    finished: list[Request] = field(default_factory=list)
    prefill_tokens: int = 0
    decode_tokens: int = 0
    cached_tokens: int = 0
    # Decodes of requests whose previous token is still in flight (async scheduling): charged only once
    # that token lands and the request goes on (engine/core/async_scheduler.py), so a discarded step is never charged.
    provisional: list[Request] = field(default_factory=list)
    # Async scheduling only: the requests this step samples, in the forward's row order, and the tokens
    # it computed for requests that had ended before its results were committed.
    sampling: list[Request] = field(default_factory=list)
    discarded_tokens: int = 0
    # Choices of n > 1 forked this step (engine/core/family.py): each samples its first token from its leader's
    # last prompt row, after the leader's own (the runner repeats that row), and runs no chunk of its own.
    forked: list[Request] = field(default_factory=list)
    # (shared, fresh) KV blocks to copy before this step's forward: copy on write of a shared partial block
    # that a chunk of this step writes into (engine/core/kv_cache.py `copy_on_write`).
    block_copies: list[tuple[int, int]] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        """Tokens in the forward pass."""
        return sum(c.length for c in self.chunks)


# Swap hooks: (request) -> bytes moved. Set by the engine when preemption_mode == "swap".
class Swap(Protocol):
    """Swap preemption's host side (engine/worker/swap.py; the simulator's bounded buffer): bytes moved, or -1 when
    the host buffer is full and the scheduler recomputes instead."""

    def swap_out(self, request: Request) -> int:
        """Copy the request's KV blocks to the host; the bytes moved, or -1."""

    def swap_in(self, request: Request) -> int:
        """Copy them back into the blocks the pool has just given it; the bytes moved."""


class AdapterSlots(Protocol):
    """What the scheduler asks of LoRA's device slots (engine/worker/lora/intake.py)."""

    @property
    def loaded_any(self) -> bool:
        """Whether some adapter has loaded, so that a request may carry a service scale."""

    def admissible(self, running: Sequence[Request], request: Request) -> bool:
        """Whether `request` may be admitted beside `running` (its adapter has or can take a device slot)."""
