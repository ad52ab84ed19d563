"""The inference engine: requests, paged KV cache, scheduler, model runner, engine loop.

Its names load on first use (PEP 562 `__getattr__`): `engine.config` is part of the settings tree, and a
command such as `fairserve tenants list` that reads settings must not pay for torch and the model runner.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.config import EngineConfig
    from engine.core.errors import DuplicateRequestError, InvalidRequestError, PromptTooLongError
    from engine.core.outputs import EngineStats, RequestInfo, RequestMetrics, RequestOutput
    from engine.core.request import FinishReason, Request, RequestMeta, RequestState
    from engine.core.sampling_params import SamplingParams
    from engine.core.trace import IterationTrace
    from engine.serving.boundary.async_engine import AsyncEngine, EngineDeadError
    from engine.serving.boundary.client import EngineClient, engine_client
    from engine.serving.boundary.front import OutputStream
    from engine.serving.boundary.process_engine import EngineStartError, ProcessEngine
    from engine.serving.llm import LLM, CompletionOutput
    from engine.serving.llm_engine import LLMEngine

# Each public name and the module that defines it.
_EXPORTS = {
    "AsyncEngine": "engine.serving.boundary.async_engine",
    "EngineDeadError": "engine.serving.boundary.async_engine",
    "EngineClient": "engine.serving.boundary.client",
    "engine_client": "engine.serving.boundary.client",
    "OutputStream": "engine.serving.boundary.front",
    "EngineStartError": "engine.serving.boundary.process_engine",
    "ProcessEngine": "engine.serving.boundary.process_engine",
    "EngineConfig": "engine.config",
    "LLM": "engine.serving.llm",
    "CompletionOutput": "engine.serving.llm",
    "LLMEngine": "engine.serving.llm_engine",
    "EngineStats": "engine.core.outputs",
    "RequestInfo": "engine.core.outputs",
    "RequestMetrics": "engine.core.outputs",
    "RequestOutput": "engine.core.outputs",
    "DuplicateRequestError": "engine.core.errors",
    "FinishReason": "engine.core.request",
    "InvalidRequestError": "engine.core.errors",
    "PromptTooLongError": "engine.core.errors",
    "Request": "engine.core.request",
    "RequestMeta": "engine.core.request",
    "RequestState": "engine.core.request",
    "SamplingParams": "engine.core.sampling_params",
    "IterationTrace": "engine.core.trace",
}

__all__ = [
    "AsyncEngine",
    "CompletionOutput",
    "DuplicateRequestError",
    "EngineClient",
    "EngineConfig",
    "EngineDeadError",
    "EngineStartError",
    "EngineStats",
    "FinishReason",
    "InvalidRequestError",
    "IterationTrace",
    "LLM",
    "LLMEngine",
    "OutputStream",
    "ProcessEngine",
    "PromptTooLongError",
    "Request",
    "RequestInfo",
    "RequestMeta",
    "RequestMetrics",
    "RequestOutput",
    "RequestState",
    "SamplingParams",
    "engine_client",
]


def __getattr__(name: str) -> Any:
    """Import the module defining `name` on first access, then keep the name here."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
