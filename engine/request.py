"""Request, sampling parameters and tenant metadata: the unit the scheduler moves between queues."""

from __future__ import annotations

import enum
import math
import time
from dataclasses import dataclass, field


class RequestState(enum.Enum):
    """Where a request is in its life: queued, computing, preempted (recompute or swap), or done."""

    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    SWAPPED = "swapped"
    FINISHED = "finished"


class FinishReason(enum.StrEnum):
    """Why a request ended; the string values are what the API and ledger show."""

    STOP = "stop"
    LENGTH = "length"
    CANCELLED = "cancelled"
    DEADLINE = "deadline"
    REJECTED = "rejected"
    ERROR = "error"


class InvalidRequestError(ValueError):
    """A request the engine refuses before queueing it; the message names the field."""

    def __init__(self, message: str, field_name: str | None = None) -> None:
        super().__init__(message)
        self.field_name = field_name


class DuplicateRequestError(InvalidRequestError):
    """A request id that is already live in the engine."""


class PromptTooLongError(InvalidRequestError):
    """Prompt plus max_tokens does not fit in the model context."""


@dataclass
class SamplingParams:
    """How to pick tokens and when to stop. temperature=0 means greedy."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    # False: only the first output (the request started) and the last are emitted, each carrying the
    # text since the previous one. A non-streaming caller needs nothing in between, and every skipped
    # output is a message the engine does not send and the caller does not wake up for.
    stream_outputs: bool = True

    def validate(self) -> None:
        """Raise InvalidRequestError naming the first bad field."""
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 1:
            raise InvalidRequestError(f"max_tokens must be a positive integer, got {self.max_tokens!r}", "max_tokens")
        if not _finite(self.temperature) or self.temperature < 0:
            raise InvalidRequestError(f"temperature must be finite and >= 0, got {self.temperature!r}", "temperature")
        if not _finite(self.top_p) or not 0 < self.top_p <= 1:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p!r}", "top_p")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise InvalidRequestError(f"top_k must be an integer >= 0 (0 disables), got {self.top_k!r}", "top_k")
        if self.seed is not None and (not isinstance(self.seed, int) or self.seed < 0):
            raise InvalidRequestError(f"seed must be a non-negative integer, got {self.seed!r}", "seed")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidRequestError("stop must be a list of non-empty strings", "stop")
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            raise InvalidRequestError("stop_token_ids must be non-negative integers", "stop_token_ids")

    @property
    def greedy(self) -> bool:
        """True when sampling degenerates to argmax."""
        return self.temperature == 0.0


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass
class RequestMeta:
    """Who asked and under what contract. Lower `priority` values are more important classes."""

    tenant_id: str = "default"
    api_key_id: str | None = None
    user: str | None = None
    task_id: str | None = None
    workflow_run_id: str | None = None
    attempt: int = 0
    priority: int = 0
    weight: float = 1.0
    deadline: float | None = None
    arrival_time: float = field(default_factory=time.time)


@dataclass
class Preemption:
    """One preemption of a request: why, how, and what it cost."""

    reason: str
    mode: str  # "recompute" or "swap"
    iteration: int
    tokens_recomputed: int = 0
    bytes_swapped: int = 0
    seconds: float = 0.0


@dataclass
class Request:
    """A live request. `num_computed_tokens` catches up with `num_tokens` one scheduled chunk at a time."""

    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    meta: RequestMeta
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    state: RequestState = RequestState.WAITING
    finish_reason: FinishReason | None = None
    # Tokens charged to the fairness policy: prompt positions are charged once, even if recomputed.
    num_charged_prompt_tokens: int = 0
    charged_service: float = 0.0
    preemptions: list[Preemption] = field(default_factory=list)
    recomputed_tokens: int = 0
    # Cancellation bookkeeping: when the signal arrived, in which state, and work done after it.
    cancel_time: float | None = None
    cancel_state: str | None = None
    tokens_after_cancel: int = 0
    # Wall-clock timings (epoch seconds).
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    # The prefix of num_tokens that was computed before the last preemption, for recompute accounting.
    recompute_until: int = 0

    @property
    def num_prompt_tokens(self) -> int:
        """Length of the prompt."""
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt plus output tokens so far."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        """Prompt followed by output."""
        return self.prompt_token_ids + self.output_token_ids

    @property
    def is_finished(self) -> bool:
        """True once the request has a finish reason."""
        return self.state is RequestState.FINISHED

    @property
    def arrival_time(self) -> float:
        """Arrival time from the metadata (the fairness item protocol)."""
        return self.meta.arrival_time
