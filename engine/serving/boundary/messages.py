"""The messages that cross the engine boundary, identical whether the loop runs on a thread or in a process.

Each is a msgspec Struct in one tagged union (`EngineMessage`), so a frame decodes into exactly one of
these types or is rejected as a whole: a truncated or foreign frame raises msgspec's DecodeError or
ValidationError instead of becoming an object of some other class, as unpickling could. Their payloads
(SamplingParams, RequestMeta, OutputDelta, EngineStats, IterationTrace) stay the engine's dataclasses,
which msgspec encodes field by field at C speed. On the thread engine the structs are passed as they are.
"""

from __future__ import annotations

import os
import time

import msgspec

from engine.core.outputs import EngineStats, OutputDelta
from engine.core.request import RequestMeta
from engine.core.sampling_params import SamplingParams
from engine.core.trace import IterationTrace

# The integers a msgspec frame can carry: int64 and uint64. Every integer a request can set is checked
# against these at the edge (gateway/openai/schemas.py), so none fails in the encoder instead.
WIRE_INT_MIN, WIRE_INT_MAX = -(2**63), 2**64 - 1


class EngineDeadError(RuntimeError):
    """The engine loop has stopped; no request can make progress."""


class Submit(msgspec.Struct, tag=True, array_like=True):
    """Queue a request the front has already validated."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    meta: RequestMeta


class Abort(msgspec.Struct, tag=True, array_like=True):
    """Cancel a live request at the next iteration boundary; work after `signal_time` counts as cancel lag."""

    request_id: str
    reason: str
    signal_time: float = msgspec.field(default_factory=time.time)


class SetWeight(msgspec.Struct, tag=True, array_like=True):
    """Change a tenant's weight (and class) for queued and future requests."""

    tenant_id: str
    weight: float
    priority: int | None


class StopLoop(msgspec.Struct, tag=True, array_like=True):
    """Cancel everything still live (reason "shutdown"), report the final outputs and stop."""


class IterationReport(msgspec.Struct, tag=True, array_like=True):
    """One iteration's outputs, with the stats snapshot and the traces recorded since the last report."""

    outputs: list[OutputDelta]
    stats: EngineStats
    traces: list[IterationTrace]


class ReportAsRead(msgspec.Struct, tag="IterationReport", array_like=True):
    """An IterationReport as the front reads it off the wire: the outputs decoded, the stats snapshot and the
    traces left as msgpack until someone asks (`EngineFront.stats`, `recent_traces`).

    Every report's outputs are needed at once; its stats only when a request is admitted (a burst of
    admissions after one report shares one decode) and its traces only when the admin API shows them.
    They were half of a report's decode.
    """

    outputs: list[OutputDelta]
    stats: msgspec.Raw
    traces: msgspec.Raw


class SubmitFailed(msgspec.Struct, tag=True, array_like=True):
    """The engine refused a submit the front had validated (a race, e.g. a duplicate id)."""

    request_id: str
    kind: str  # the exception's class name
    message: str
    field_name: str | None


class WorkerReady(msgspec.Struct, tag=True, array_like=True):
    """Sent once the engine is built: what the front needs to name the model and validate requests itself."""

    model_name: str
    max_model_len: int
    vocab_size: int
    block_size: int
    num_kv_blocks: int
    stats: EngineStats
    pid: int = msgspec.field(default_factory=os.getpid)
    entered_at: float = 0.0  # wall time run_worker began: after the spawn, the interpreter and the imports
    build_seconds: float = 0.0  # building the LLMEngine: model load, KV cache, warm-up


class WorkerFailed(msgspec.Struct, tag=True, array_like=True):
    """The engine could not be built, or its loop died."""

    error: str


class WorkerExiting(msgspec.Struct, tag=True, array_like=True):
    """The worker's last message on a clean exit: everything it sent before has arrived.

    A pipe says this by end of file; a ZeroMQ socket has no end of file, and the process sentinel can fire
    before the parent's socket has taken the last frames in, so the front waits (bounded) for this.
    """


# What the front sends to the loop, and what the loop sends back: each direction decodes only its own kinds.
ToEngine = Submit | Abort | SetWeight | StopLoop
FromEngine = IterationReport | SubmitFailed | WorkerReady | WorkerFailed | WorkerExiting
# The same frames as the front's channel decodes them (ReportAsRead for IterationReport).
FromEngineAsRead = ReportAsRead | SubmitFailed | WorkerReady | WorkerFailed | WorkerExiting
