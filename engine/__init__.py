"""The inference engine: requests, paged KV cache, scheduler, model runner, engine loop.

Its names load on first use (PEP 562 `__getattr__`): `engine.config` is part of the settings tree, and a
command such as `fairserve tenants list` that reads settings must not pay for torch and the model runner.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.boundary.async_engine import AsyncEngine, EngineDeadError
    from engine.boundary.client import EngineClient, engine_client
    from engine.boundary.front import OutputStream
    from engine.boundary.process_engine import EngineStartError, ProcessEngine
    from engine.config import EngineConfig
    from engine.llm import LLM, CompletionOutput
    from engine.llm_engine import LLMEngine
    from engine.outputs import EngineStats, RequestInfo, RequestMetrics, RequestOutput
    from engine.request import (
        DuplicateRequestError,
        FinishReason,
        InvalidRequestError,
        PromptTooLongError,
        Request,
        RequestMeta,
        RequestState,
        SamplingParams,
    )
    from engine.trace import IterationTrace

# Each public name and the module that defines it.
_EXPORTS = {
    "AsyncEngine": "engine.boundary.async_engine",
    "EngineDeadError": "engine.boundary.async_engine",
    "EngineClient": "engine.boundary.client",
    "engine_client": "engine.boundary.client",
    "OutputStream": "engine.boundary.front",
    "EngineStartError": "engine.boundary.process_engine",
    "ProcessEngine": "engine.boundary.process_engine",
    "EngineConfig": "engine.config",
    "LLM": "engine.llm",
    "CompletionOutput": "engine.llm",
    "LLMEngine": "engine.llm_engine",
    "EngineStats": "engine.outputs",
    "RequestInfo": "engine.outputs",
    "RequestMetrics": "engine.outputs",
    "RequestOutput": "engine.outputs",
    "DuplicateRequestError": "engine.request",
    "FinishReason": "engine.request",
    "InvalidRequestError": "engine.request",
    "PromptTooLongError": "engine.request",
    "Request": "engine.request",
    "RequestMeta": "engine.request",
    "RequestState": "engine.request",
    "SamplingParams": "engine.request",
    "IterationTrace": "engine.trace",
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
