"""Logs to operate by: the process's log setup (`--log-level`, `--log-format text|json`), the start-up
summary, and the access log (`--access-log`, off by default).

Everything goes to stderr; stdout carries only the banner (gateway/cli/serve.py). The JSON formatter is
the standard library's `logging.Formatter` with `json.dumps`: one object a line with `time`, `level`,
`logger`, `message` and a record's `fields` (the access log's and the summary's); a dependency for those
twenty lines (python-json-logger) would add nothing a collector needs.

The access log is one line per HTTP request, written after its last byte: request id, tenant name (never a
key: the caller's tenant as authenticated, "-" before that), method, path, status, prompt and completion
tokens, the time queued in the engine and the total time. The routes leave the tenant and the usage in the
ASGI scope's `state` (EdgeMiddleware's dict), which this middleware reads when the response has ended.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from datetime import UTC, datetime
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engine import RequestMetrics
from gateway.edge.middleware import TENANT_KEY, USAGE_KEY

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
ACCESS = logging.getLogger("fairserve.access")


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time (UTC, ISO 8601), level, logger, message, and the record's `fields`."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            # A record with fields says them as JSON keys, not again in its message (`log_fields`).
            "message": getattr(record, "what", None) or record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update(fields)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


_HANDLER = "fairserve.stderr"


def configure(level: str, fmt: str) -> None:
    """The root logger writes `level` and above to stderr as `fmt` ("text" or "json"); replaces any handler."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    handler.set_name(_HANDLER)
    root = logging.getLogger()
    # Replace the handler an earlier call installed; keep any other (a test's capture, an embedder's).
    root.handlers[:] = [h for h in root.handlers if h.get_name() != _HANDLER] + [handler]
    root.setLevel(level.upper())
    # Migration chatter drowns the banner; it says something only when it fails.
    logging.getLogger("alembic").setLevel(max(logging.WARNING, root.level))
    # One line per upstream call and metrics read (upstream/) would bury the access log.
    logging.getLogger("httpx").setLevel(max(logging.WARNING, root.level))


def fields_line(fields: dict[str, Any]) -> str:
    """`key=value` pairs, the text form of a record's fields."""
    return " ".join(f"{k}={v}" for k, v in fields.items())


def log_fields(logger: logging.Logger, level: int, what: str, fields: dict[str, Any]) -> None:
    """One record: `what` and the fields as text, and the fields as JSON keys under --log-format json."""
    logger.log(level, "%s %s", what, fields_line(fields), extra={"fields": fields, "what": what})


class AccessLog:
    """ASGI middleware: one `fairserve.access` INFO line per HTTP request, after its response ends."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        scope.setdefault("state", {})  # the one dict the routes write the tenant and usage into
        status = [0]

        async def recorded(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, recorded)
        finally:
            _access_line(scope, status[0] or 500, time.perf_counter() - started)


def _access_line(scope: Scope, status: int, total_s: float) -> None:
    state = scope.get("state", {})
    usage = state.get(USAGE_KEY) or {}
    fields: dict[str, Any] = {
        "request_id": state.get("request_id", "-"),
        "tenant": state.get(TENANT_KEY, "-"),
        "method": scope.get("method", "-"),
        "path": scope.get("path", "-"),
        "status": status,
        "prompt_tokens": usage.get("prompt_tokens", 0),
        "completion_tokens": usage.get("completion_tokens", 0),
        "queue_ms": usage.get("queue_ms", 0),
        "total_ms": round(total_s * 1000),
    }
    log_fields(ACCESS, logging.INFO, "request", fields)


def access_usage(m: RequestMetrics) -> dict[str, int]:
    """A finished run's part of its access line: tokens, and the time from arrival to first scheduled."""
    queued = (m.first_scheduled_time - m.arrival_time) if m.first_scheduled_time is not None else 0.0
    return {
        "prompt_tokens": m.prompt_tokens,
        "completion_tokens": m.completion_tokens,
        "queue_ms": max(0, round(queued * 1000)),
    }
