"""What the engine hands upward: per-request outputs with their metrics, and engine-wide stats."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.request import FinishReason, Request


@dataclass
class RequestMetrics:
    """Token counts, service and timings of one request (epoch seconds)."""

    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    charged_service: float
    preemptions: int
    recomputed_tokens: int
    tokens_after_cancel: int
    cancel_state: str | None
    arrival_time: float
    first_scheduled_time: float | None
    first_token_time: float | None
    finished_time: float | None

    @classmethod
    def of(cls, request: Request) -> RequestMetrics:
        """Snapshot a request's metrics."""
        return cls(
            prompt_tokens=request.num_prompt_tokens,
            cached_tokens=request.num_cached_tokens,
            completion_tokens=len(request.output_token_ids),
            charged_service=request.charged_service,
            preemptions=len(request.preemptions),
            recomputed_tokens=request.recomputed_tokens,
            tokens_after_cancel=request.tokens_after_cancel,
            cancel_state=request.cancel_state,
            arrival_time=request.meta.arrival_time,
            first_scheduled_time=request.first_scheduled_time,
            first_token_time=request.first_token_time,
            finished_time=request.finished_time,
        )


@dataclass
class RequestOutput:
    """An incremental update of one request; the last one has `finished=True`."""

    request_id: str
    prompt_token_ids: list[int]
    new_token_ids: list[int]
    token_ids: list[int]
    delta_text: str
    text: str
    finished: bool
    finish_reason: FinishReason | None
    metrics: RequestMetrics


@dataclass
class OutputDelta:
    """A RequestOutput without the running totals: only what is new. The engine loop emits these and the
    front keeps the prompt, token and text totals, so neither the engine (copying every token so far)
    nor the pipe (pickling them) pays O(context) per stream per iteration."""

    request_id: str
    new_token_ids: list[int]
    delta_text: str
    finished: bool
    finish_reason: FinishReason | None
    metrics: RequestMetrics

    @classmethod
    def of(cls, out: RequestOutput) -> OutputDelta:
        """The new part of `out`."""
        return cls(out.request_id, out.new_token_ids, out.delta_text, out.finished, out.finish_reason, out.metrics)


@dataclass
class RequestInfo:
    """Who owns a live request and where it is, for cancel checks at the edge."""

    request_id: str
    tenant_id: str
    task_id: str | None
    state: str


@dataclass
class EngineStats:
    """A snapshot of the engine, published by the loop after every iteration."""

    alive: bool = True
    waiting: int = 0
    running: int = 0
    waiting_by_tenant: dict[str, int] = field(default_factory=dict)
    running_by_tenant: dict[str, int] = field(default_factory=dict)
    waiting_tokens: int = 0
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    batch_size: int = 0
    prefill_tokens_per_s: float = 0.0
    decode_tokens_per_s: float = 0.0
    iteration_seconds: float = 0.0
    max_num_batched_tokens: int = 0
    max_num_seqs: int = 0
    preemptions_total: int = 0
    preemptions_by_kind: dict[str, int] = field(default_factory=dict)  # "reason/mode" -> count
    recomputed_tokens_total: int = 0
    swapped_bytes_total: int = 0
    kv_alloc_failures: int = 0
    deadline_misses: int = 0
    waiting_for_blocks: int = 0
    service: dict[str, float] = field(default_factory=dict)
    iterations: int = 0
