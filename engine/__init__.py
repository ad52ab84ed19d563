"""The inference engine: requests, paged KV cache, scheduler, model runner, engine loop."""

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

__all__ = [
    "LLM",
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
