"""One request to an upstream model, from the gateway's queue to its last chunk, and what it is charged.

It is the fairness policy's item (fairness/base.py `Item`: a request id and the request's `RequestMeta`),
so the dispatcher orders and charges it with the same policy and counters the engine's scheduler uses.
Charges follow the engine's: prompt tokens when the request is dispatched, each output token as it
streams back, and at the end the difference to the engine's own final usage (never less than charged:
a counter only grows). Where the engine sends no usage, the gateway's count stands, and the row says so.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from engine.core.outputs import RequestMetrics
from engine.core.request import RequestMeta
from engine.core.sampling_params import SamplingParams
from upstream.call import Chunk, Usage


@dataclass(eq=False)
class Pending:
    """A request the gateway holds for an upstream model (queued, then in flight)."""

    request_id: str
    meta: RequestMeta
    prompt_token_ids: list[int]
    params: SamplingParams
    prompt_text: str
    queued_at: float = field(default_factory=time.monotonic)
    dispatched_at: float | None = None  # monotonic
    first_scheduled_time: float | None = None  # epoch, as the engine's metrics keep it
    first_token_time: float | None = None
    first_token_at: float | None = None  # monotonic, for the time per output token
    last_token_at: float | None = None
    charged_prompt: int = 0  # tokens charged to the policy so far
    charged_output: int = 0
    charged_service: float = 0.0
    counted: int = 0  # output tokens as counted so far (the engine's running usage, else the gateway's)
    engine_usage: Usage | None = None  # the engine's latest usage, running or final
    text: str = ""
    finish_reason: str | None = None
    cancel_reason: str | None = None  # set when the client cancelled while it was in flight
    tokens_after_cancel: int = 0
    task: asyncio.Task[None] | None = None
    timer: asyncio.TimerHandle | None = None
    attempts: int = 0
    counted_by_gateway: bool = False  # the engine sent no usage: the tokens are the gateway's count

    @property
    def cancelled(self) -> bool:
        return self.cancel_reason is not None

    def new_output_tokens(self, chunk: Chunk, local_count: int, continuous: bool) -> int:
        """How many output tokens `chunk` brings: the engine's running usage where it sends one per chunk
        (vLLM, SGLang with continuous_usage_stats), else the gateway's count of the chunk's text."""
        if chunk.usage is not None:
            self.engine_usage = chunk.usage
        if continuous and chunk.usage is not None:
            new = max(0, chunk.usage.completion_tokens - self.counted)
        elif chunk.text:
            new = local_count
        else:
            new = 0
        self.counted += new
        return new

    def metrics(self, completion_tokens: int, finished: bool) -> RequestMetrics:
        """The engine-shaped metrics the gateway reads for the reply's usage and the ledger row."""
        usage = self.engine_usage
        prompt = usage.prompt_tokens if finished and usage is not None and usage.prompt_tokens else None
        return RequestMetrics(
            prompt if prompt is not None else len(self.prompt_token_ids),
            0,
            completion_tokens,
            self.charged_service,
            0,
            0,
            self.tokens_after_cancel,
            "running" if self.cancelled and self.dispatched_at is not None else None,
            self.meta.arrival_time,
            self.first_scheduled_time,
            self.first_token_time,
            time.time() if finished else None,
            counted_by_gateway=self.counted_by_gateway,
        )

    def final_counts(self, local_total: int) -> tuple[int, int, bool]:
        """(prompt tokens, completion tokens, counted by the gateway) at the end: the engine's final usage
        when it sent one, else the prompt the gateway tokenised and the output it counted."""
        usage = self.engine_usage
        if usage is not None and (usage.completion_tokens or not self.text):
            return usage.prompt_tokens or len(self.prompt_token_ids), usage.completion_tokens, False
        return len(self.prompt_token_ids), max(local_total, self.counted), True


def as_dict(pending: Pending) -> dict[str, Any]:
    """A queued or running request for logs and tests: ids, tokens and charges."""
    return {
        "request_id": pending.request_id,
        "tenant": pending.meta.tenant_id,
        "charged_service": pending.charged_service,
        "counted": pending.counted,
    }
