"""Request and tenant metadata: the unit the scheduler moves between queues (its sampling parameters are
engine/core/sampling_params.py's, its errors engine/core/errors.py's)."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from functools import cached_property

from engine.core.errors import RequestFault
from engine.core.kv_cache import prefix_root
from engine.core.sampling_params import SamplingParams
from engine.core.token_logprobs import TokenLogprobs


class RequestState(enum.Enum):
    """Where a request is in its life: waiting for something of its own (its adapter, its grammar, its KV
    from a prefill engine: engine/core/waits.py), queued, computing, preempted (recompute or swap), or done."""

    WAITING_FOR_ADAPTER = "waiting_for_adapter"
    WAITING_FOR_GRAMMAR = "waiting_for_grammar"
    WAITING_FOR_KV = "waiting_for_kv"
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
    HANDOFF = "handoff"  # a prefill engine's part ended: the request goes on on a decode engine (engine/serving/disagg.py)


KV_HOLD = "hold"  # RequestMeta.kv_handoff on a prefill engine: keep the KV for a decode engine


@dataclass
class RequestMeta:
    """Who asked and under what contract. Lower `priority` values are more important classes."""

    tenant_id: str = "default"
    # Prefix-cache isolation (engine/core/kv_cache.py): blocks are shared only between requests of the same
    # group (the tenant's own id unless an admin put it in a named group) and the same cache_salt.
    cache_group: str | None = None
    cache_salt: str | None = None
    # Leading prompt tokens that equal a registered public prefix (gateway/public_prefixes.py), set only by
    # the gateway, which alone holds the registry: blocks wholly inside them are keyed publicly.
    public_prefix_tokens: int = 0
    # The LoRA adapter the request runs with (engine/worker/lora/; `model: NAME` at the gateway); None: the base model.
    # Its KV is keyed apart (prefix_root), since an adapter changes every layer's K and V. Without lora_path
    # the name is one of the engine's `--lora` entries; with it, the engine loads that directory on demand.
    lora: str | None = None
    lora_path: str | None = None  # the adapter's PEFT directory, from the gateway's adapter directory
    # When the gateway's adapter directory registered it (ISO time; None for a `--lora` adapter): an adapter
    # that faulted is refused until it is registered again, which changes this (engine/worker/lora/host_cache.py).
    lora_registered: str | None = None
    api_key_id: str | None = None
    user: str | None = None
    task_id: str | None = None
    workflow_run_id: str | None = None
    attempt: int = 0
    priority: int = 0
    weight: float = 1.0
    deadline: float | None = None
    # At the deadline a request that has produced tokens ends as `length` with them (a controlled partial
    # answer, X-On-Infeasible: partial) instead of `deadline`.
    partial_at_deadline: bool = False
    arrival_time: float = field(default_factory=time.time)
    traceparent: str | None = (
        None  # W3C trace context of the gateway's span: the engine's spans descend from it
    )
    ledger_id: str | None = (
        None  # the caller's request id: the key of the ledger row the engine's record bills
    )
    # Prefill and decode on separate engines (engine/serving/disagg.py): KV_HOLD asks a prefill engine to keep the
    # KV after the first token for a decode engine; a tcp:// address tells a decode engine where to pull it.
    kv_handoff: str | None = None
    # The decode part's start of a stop string that its prefill part held back unreleased (engine/serving/disagg.py):
    # its StopMatcher begins with it, so a stop spanning the first and second tokens matches as co-located.
    held_text: str = ""
    # CPU seconds the gateway spent preparing this request (validating its body, rendering its chat,
    # tokenising): the tenant's own cost, charged by the engine as grammar CPU is (engine/worker/grammar/intake.py).
    preprocess_cpu_s: float = 0.0

    @property
    def decode_part(self) -> bool:
        """The second part of a split request, whose prefill engine counts the request and its prompt."""
        return self.kv_handoff is not None and self.kv_handoff != KV_HOLD


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
    num_public_cached_tokens: int = 0  # the part of num_cached_tokens that hit public-prefix blocks
    state: RequestState = RequestState.WAITING
    finish_reason: FinishReason | None = None
    # Tokens charged to the fairness policy: prompt positions are charged once, even if recomputed.
    num_charged_prompt_tokens: int = 0
    charged_service: float = 0.0
    # Each token's service multiplier: 1 + a LoRA adapter's extra FLOPs share (engine/worker/lora/cost.py).
    service_scale: float = 1.0
    # Set when a fault of its own input (RequestFault) ended it inside a step: its outputs carry it.
    fault: RequestFault | None = None
    # The step cost model's work beyond new tokens (engine/core/step_cost.py) owed and not yet charged (charged
    # in whole prefill tokens), and a provisional decode's work, charged when its step commits.
    step_work_owed: float = 0.0
    step_work_pending: float = 0.0
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
    # 1 while a token of this request is being sampled by a forward still in flight (async scheduling,
    # engine/core/async_scheduler.py): the last output id is then a placeholder, -(1 + its row in that step's samples).
    num_output_placeholders: int = 0
    # Prefix-cache keys of the prompt's full blocks, computed once when a locality policy first asks
    # (engine/core/policy.py, `cached_blocks_probe`).
    prompt_block_keys: list[bytes] | None = None
    # SamplingParams.logprobs: one entry per output token, in step with output_token_ids.
    output_logprobs: list[TokenLogprobs] = field(default_factory=list)
    # n > 1: the choices this request is one of (Family, below; engine/core/family.py), and which one; None for a
    # lone request.
    family: Family | None = field(default=None, repr=False, compare=False)
    choice_index: int = 0

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
    def phase(self) -> str:
        """Where the request is: "transfer" (its KV on its way from a prefill engine), "waiting" (nothing
        computed yet), "prefill" or "decode"."""
        if self.state is RequestState.WAITING_FOR_KV:
            return "transfer"
        if (
            self.state is not RequestState.RUNNING
            and self.num_computed_tokens == 0
            and not self.output_token_ids
        ):
            return "waiting"
        return "prefill" if self.num_computed_tokens < self.num_prompt_tokens else "decode"

    def stop_reason(
        self, token: int, eos_token_ids: set[int] | frozenset[int], max_model_len: int
    ) -> FinishReason | None:
        """Token-level stop conditions for `token`, just appended (stop strings are the engine's, on text)."""
        params = self.sampling
        if (not params.ignore_eos and token in eos_token_ids) or token in params.stop_token_ids:
            return FinishReason.STOP
        if len(self.output_token_ids) >= params.max_tokens or self.num_tokens >= max_model_len:
            return FinishReason.LENGTH
        return None

    @cached_property
    def prefix_root(self) -> bytes:
        """Where this request's prefix-cache keys chain from: its cache group and salt (engine/core/kv_cache.py)."""
        meta = self.meta
        return prefix_root(meta.tenant_id, meta.cache_group, meta.cache_salt, meta.lora, meta.lora_path)

    def public_blocks(self, block_size: int) -> int:
        """Prompt blocks keyed in the public namespace: those wholly inside the public prefix (none under a
        LoRA adapter: public blocks hold the base model's KV)."""
        if self.meta.lora is not None:
            return 0
        return max(0, min(self.meta.public_prefix_tokens, len(self.prompt_token_ids))) // block_size

    def cache_chain(self, block_size: int) -> tuple[bytes, int]:
        """(root, public blocks): how this request's prefix-cache keys chain (engine/core/kv_cache.py)."""
        return self.prefix_root, self.public_blocks(block_size)

    @property
    def arrival_time(self) -> float:
        """Arrival time from the metadata (the fairness item protocol)."""
        return self.meta.arrival_time


@dataclass(eq=False)
class Family:
    """The n choices of one request, each a Request of its own, by index (SamplingParams.n > 1).

    Defined here, beside Request, because each names the other; what is done with a family (make, fork,
    end) is engine/core/family.py's, which imports this module and is never imported by it.
    """

    request_id: str  # the request's id: what outputs, aborts and the ledger name
    members: list[Request]  # by choice index
    fork_at: int
    pending: list[Request] = field(default_factory=list)  # followers not yet forked
    ended: int = 0  # members whose final output went out: the last one's ends the request

    @property
    def leader(self) -> Request:
        """Choice 0: the member that prefills the shared prompt."""
        return self.members[0]


def decodes_first(running: list[Request]) -> list[Request]:
    """`running` in scheduling order: decodes before partial prefills (stall-free), by class first when the
    classes differ. `running` is kept sorted by class, so equal ends mean one class."""
    if running[0].meta.priority != running[-1].meta.priority:
        return sorted(running, key=_class_then_prefill)
    decodes: list[Request] = []
    prefills: list[Request] = []
    for r in running:
        (decodes if _is_decode(r) else prefills).append(r)
    return decodes + prefills


def _is_decode(request: Request) -> bool:
    # A decode: output exists and only the last sampled token is uncomputed.
    return bool(request.output_token_ids) and request.num_computed_tokens == request.num_tokens - 1


def _class_then_prefill(request: Request) -> tuple[int, bool]:
    return request.meta.priority, not _is_decode(request)  # sorted() is stable
