"""What the engine hands upward: per-request outputs with their metrics, and engine-wide stats."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

import msgspec

from engine.core.request import FinishReason, Request
from engine.core.sampling_params import SamplingParams
from engine.core.token_logprobs import TokenLogprobs


def text_in_loop(params: SamplingParams) -> bool:
    """Whether the engine loop itself detokenizes a request when a front serves it: only one with stop strings.

    A stop string must end its request in the iteration whose token completes the match, so that the
    request is charged (fairness counters, ledger) exactly the tokens up to it; an abort sent back by
    a front would arrive an iteration or more later, after more tokens were computed and charged.
    Every other request's ids are turned into text by the front (engine/serving/boundary/front.py), off the loop.
    """
    return bool(params.stop)


def new_logprobs(request: Request, new_ids: list[int]) -> list[TokenLogprobs] | None:
    """The logprobs of a request's `new_ids` (its last output ids), or None when it did not ask for them."""
    if request.sampling.logprobs is None:
        return None
    end = len(request.output_token_ids)
    return request.output_logprobs[end - len(new_ids) : end]


class RequestMetrics(msgspec.Struct, array_like=True, gc=False):
    """Token counts, service and timings of one request (epoch seconds).

    A msgspec Struct encoded as an array: the engine worker sends one per request per step across the
    engine boundary (engine/serving/boundary/messages.py), and positional fields keep that frame small and fast to decode.
    """

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
    public_cached_tokens: int = 0  # the part of cached_tokens that hit public-prefix blocks (kv_cache.py)
    # An upstream engine (upstream/) sent no usage: completion_tokens is the gateway's count of the stream.
    counted_by_gateway: bool = False

    @classmethod
    def of(cls, request: Request) -> RequestMetrics:
        """Snapshot a request's metrics (positional and slotted: the loop makes one per output per step)."""
        if request.family is not None:
            return cls.of_family(request.family.members)
        return cls(
            len(request.prompt_token_ids),
            request.num_cached_tokens,
            len(request.output_token_ids),
            request.charged_service,
            len(request.preemptions),
            request.recomputed_tokens,
            request.tokens_after_cancel,
            request.cancel_state,
            request.meta.arrival_time,
            request.first_scheduled_time,
            request.first_token_time,
            request.finished_time,
            request.num_public_cached_tokens,
        )

    @classmethod
    def of_family(cls, members: Sequence[Request]) -> RequestMetrics:
        """The metrics of a request of n choices, summed over them: its prompt once (the leader's, which
        prefilled it), every choice's completion tokens, service, preemptions and recompute."""
        leader = members[0]
        firsts = [m.first_token_time for m in members if m.first_token_time is not None]
        ends = [m.finished_time for m in members]
        return cls(
            len(leader.prompt_token_ids),
            leader.num_cached_tokens,
            sum(len(m.output_token_ids) for m in members),
            sum(m.charged_service for m in members),
            sum(len(m.preemptions) for m in members),
            sum(m.recomputed_tokens for m in members),
            sum(m.tokens_after_cancel for m in members),
            leader.cancel_state,
            leader.meta.arrival_time,
            leader.first_scheduled_time,
            min(firsts) if firsts else None,
            None if None in ends else max(e for e in ends if e is not None),
            leader.num_public_cached_tokens,
        )


class TokenPrefix(Sequence[int]):
    """The first `n` ids of a list that only ever grows: a snapshot of the tokens so far without a copy.

    The engine front hands one to every output it rebuilds from deltas; a copy per output made a long
    stream cost O(tokens^2) on the gateway's event loop (26 us per output at 8,000 tokens).
    """

    __slots__ = ("_ids", "_n")

    def __init__(self, ids: list[int], n: int) -> None:
        self._ids = ids
        self._n = n

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> list[int]: ...
    def __getitem__(self, index: int | slice) -> int | list[int]:
        if isinstance(index, slice):
            return self._ids[: self._n][index]
        if index < 0:
            index += self._n
        if not 0 <= index < self._n:
            raise IndexError("token index out of range")
        return self._ids[index]

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(self._ids, self._n)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str | bytes):
            return NotImplemented
        return len(other) == self._n and all(a == b for a, b in zip(self, other, strict=False))

    __hash__ = None  # type: ignore[assignment]  # unhashable like the list it equals; typeshed types __hash__ as a method

    def __repr__(self) -> str:
        return repr(list(self))

    def __reduce__(self) -> tuple[Any, ...]:
        return list, (list(self),)  # pickles (and copies) as the plain list it stands for


@dataclass(slots=True)
class RequestOutput:
    """An incremental update of one request; the last one has `finished=True` (slotted: a front makes one per
    token of every stream)."""

    request_id: str
    prompt_token_ids: list[int]
    new_token_ids: list[int]
    token_ids: Sequence[int]  # every token so far: a list from LLMEngine.step, a TokenPrefix from a front
    delta_text: str
    text: str
    finished: bool
    finish_reason: FinishReason | None
    metrics: RequestMetrics
    held_text: str = ""  # finish_reason `handoff`: the text held back for the decode part (OutputDelta)
    new_logprobs: list[TokenLogprobs] | None = None  # of new_token_ids, when SamplingParams.logprobs asked
    # n > 1: which choice this output is of. Its token ids and text are that choice's; `finished` is the
    # request's end (its last choice's), a choice's own end shows as its `finish_reason`.
    index: int = 0
    fault: Fault | None = None  # finish_reason "error" for a fault of its own input: the field to name


class Fault(msgspec.Struct, array_like=True, frozen=True):
    """A request's own fault inside a step (engine/core/errors.py RequestFault), as its outputs carry it."""

    message: str
    field_name: str | None


def fault_of(request: Request) -> Fault | None:
    """The request's fault as an output carries it, or None."""
    fault = request.fault
    return None if fault is None else Fault(str(fault), fault.field_name)


class OutputDelta(msgspec.Struct, array_like=True, gc=False):
    """A RequestOutput without the running totals: only what is new. The engine loop emits these and the
    front keeps the prompt, token and text totals, so neither the engine (copying every token so far)
    nor the transport (encoding them) pays O(context) per stream per iteration. An array-like Struct
    for the same reason as RequestMetrics."""

    request_id: str
    new_token_ids: list[int]
    delta_text: str
    finished: bool
    finish_reason: FinishReason | None
    metrics: RequestMetrics
    # Set only on a prefill part's last output (finish_reason `handoff`, engine/serving/disagg.py): the possible
    # start of a stop string its StopMatcher held back, not released; the decode part starts with it.
    # Trailing with a default, so a frame without it still decodes; empty, it is one byte on the wire.
    held_text: str = ""
    logprobs: list[TokenLogprobs] | None = None  # of new_token_ids, when SamplingParams.logprobs asked
    index: int = 0  # n > 1: the choice (RequestOutput.index)
    fault: Fault | None = None  # RequestOutput.fault


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
    # Each fairness key's weight as the scheduler applies it now (a weight change is seen to have landed),
    # and the seconds each tenant has had a request waiting (queued, not running) since the engine started:
    # over a window, its backlogged share of time. A tenant served under its weight share while backlogged
    # is treated unfairly; one that was rarely backlogged asked for less (gateway/admin/live.py).
    weights: dict[str, float] = field(default_factory=dict)
    backlogged_s: dict[str, float] = field(default_factory=dict)
    iterations: int = 0
    # Shared counters (engine/serving/counter_sync.py): "off", "ok", or "stale" (Redis unreachable: this engine runs on
    # the counters it has); seconds since the last successful exchange; other engines publishing.
    counter_sync: str = "off"
    counter_sync_age_s: float = 0.0
    counter_sync_engines: int = 0
    # Prefill and decode apart (engine/serving/disagg.py): KV this decode engine pulled, and its time and bytes.
    kv_transfers: int = 0
    kv_transfer_s: float = 0.0
    kv_transfer_bytes: int = 0


def request_output(
    request: Request, text: str, new_ids: list[int], delta: str, finished: bool
) -> RequestOutput:
    """`LLMEngine.step`'s output of one request (of a choice: its family's id, its own index)."""
    return RequestOutput(
        request_id=request.request_id if request.family is None else request.family.request_id,
        prompt_token_ids=request.prompt_token_ids,
        new_token_ids=new_ids,
        token_ids=list(request.output_token_ids),
        delta_text=delta,
        text=text,
        finished=finished,
        finish_reason=request.finish_reason,
        metrics=RequestMetrics.of(request),
        new_logprobs=new_logprobs(request, new_ids),
        index=request.choice_index,
        fault=fault_of(request),
    )


def output_delta(request: Request, new_ids: list[int], delta: str, finished: bool) -> OutputDelta:
    """`LLMEngine.step_deltas`'s output of one request: only what is new."""
    return OutputDelta(
        request.request_id if request.family is None else request.family.request_id,
        new_ids,
        delta,
        finished,
        request.finish_reason,
        RequestMetrics.of(request),
        logprobs=new_logprobs(request, new_ids),
        index=request.choice_index,
        fault=fault_of(request),
    )
