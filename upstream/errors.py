"""Errors of the upstream layer, each one request's or one start's."""

from __future__ import annotations

from engine import EngineStartError
from engine.serving.boundary.messages import EngineDeadError


class UpstreamStartError(EngineStartError):
    """An upstream is not there (or not what it should be) at start: one line, exit, as for `--engine`."""


class UpstreamFailed(EngineDeadError):
    """An upstream call failed (refused, 5xx, dropped mid-stream) with no replica left to retry on: the
    gateway answers it as an engine that stopped, a retryable 503."""


class QueuedPastDeadline(Exception):
    """A request's deadline passed while it waited in the gateway's upstream queue (it never reached the
    engine): answered 503 with Retry-After, billed nothing (gateway/openai/runs.py)."""

    def __init__(self, retry_after_s: float) -> None:
        super().__init__("the deadline passed while the request waited for its upstream engine")
        self.retry_after_s = retry_after_s
