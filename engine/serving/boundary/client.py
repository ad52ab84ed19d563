"""`EngineClient`: the one surface the gateway uses, whatever carries its messages to the engine loop.

The loop may run on a thread of the gateway (AsyncEngine), or in a worker process reached over ZeroMQ
(ProcessEngine, or a `fairserve engine` over TCP); the gateway types its engine as this
protocol and builds it with `engine_client`, so none of that shows above this line.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Protocol

from engine.config import EngineConfig
from engine.core.limits import RequestCaps
from engine.core.outputs import EngineStats, RequestInfo, RequestOutput
from engine.core.request import RequestMeta
from engine.core.sampling_params import SamplingParams
from engine.core.tokenizer import Tokenizer
from engine.core.trace import IterationTrace
from engine.serving.boundary.front import OutputStream, Sink


class EngineClient(Protocol):
    """Submit, abort, weights, stats and outputs (as streams or sinks) of one engine."""

    model_name: str
    max_model_len: int
    tokenizer: Tokenizer

    @property
    def caps(self) -> RequestCaps:
        """The per-request caps the engine enforces, for checks at the edge."""

    @property
    def is_alive(self) -> bool:
        """True while the engine loop runs."""

    def start(self) -> None:
        """Start the loop (bounded wait for a worker's ready message)."""

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop the loop; in-flight requests end as cancelled."""

    def generate(
        self, prompt_token_ids: Sequence[int], params: SamplingParams, meta: RequestMeta, request_id: str
    ) -> AsyncIterator[RequestOutput]:
        """Queue a request and yield its outputs."""

    def submit(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        meta: RequestMeta,
        request_id: str,
        sink: Sink | None = None,
    ) -> OutputStream:
        """Validate and queue a request now; outputs go to the stream or the sink."""

    def abort(self, request_id: str, reason: str = "cancelled") -> bool:
        """Cancel a live request at the next iteration boundary."""

    def cancel_task(self, task_id: str) -> list[str]:
        """Cancel every live request of a task."""

    def live_request(self, request_id: str) -> RequestInfo | None:
        """Owner of a live request, for tenant checks at the edge."""

    def set_tenant_weight(self, tenant_id: str, weight: float, priority: int | None = None) -> None:
        """Change a tenant's weight (and class)."""

    def stats(self) -> EngineStats:
        """The latest published stats snapshot."""

    def recent_traces(self, n: int = 50) -> list[IterationTrace]:
        """The last `n` iteration traces."""


def engine_client(config: EngineConfig, in_process: bool) -> EngineClient:
    """The engine for `config`: its loop on a thread here (`in_process`) or in a worker process."""
    # deferred: each pulls in torch, the caller picks one
    from engine.serving.boundary.async_engine import AsyncEngine
    from engine.serving.boundary.process_engine import ProcessEngine

    return AsyncEngine(config) if in_process else ProcessEngine(config)
