"""The messages that cross the engine boundary, identical whether the loop runs on a thread or in a process."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from engine.outputs import EngineStats, OutputDelta
from engine.request import RequestMeta, SamplingParams
from engine.trace import IterationTrace


class EngineDeadError(RuntimeError):
    """The engine loop has stopped; no request can make progress."""


@dataclass
class Submit:
    """Queue a request the front has already validated."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    meta: RequestMeta


@dataclass
class Abort:
    """Cancel a live request at the next iteration boundary; work after `signal_time` counts as cancel lag."""

    request_id: str
    reason: str
    signal_time: float = field(default_factory=time.time)


@dataclass
class SetWeight:
    """Change a tenant's weight (and class) for queued and future requests."""

    tenant_id: str
    weight: float
    priority: int | None


@dataclass
class StopLoop:
    """Cancel everything still live (reason "shutdown"), report the final outputs and stop."""


@dataclass
class IterationReport:
    """One iteration's outputs, with the stats snapshot and the traces recorded since the last report."""

    outputs: list[OutputDelta]
    stats: EngineStats
    traces: list[IterationTrace]


@dataclass
class SubmitFailed:
    """The engine refused a submit the front had validated (a race, e.g. a duplicate id)."""

    request_id: str
    kind: str  # the exception's class name
    message: str
    field_name: str | None


@dataclass
class WorkerReady:
    """Sent once the engine is built: what the front needs to name the model and validate requests itself."""

    model_name: str
    max_model_len: int
    vocab_size: int
    block_size: int
    num_kv_blocks: int
    stats: EngineStats
    pid: int = field(default_factory=os.getpid)
    entered_at: float = 0.0  # wall time run_worker began: after the spawn, the interpreter and the imports
    build_seconds: float = 0.0  # building the LLMEngine: model load, KV cache, warm-up


@dataclass
class WorkerFailed:
    """The engine could not be built, or its loop died."""

    error: str
