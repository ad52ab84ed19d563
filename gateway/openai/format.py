"""OpenAI response shapes: completion and chat bodies, stream chunks, usage, finish reasons."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from engine import FinishReason, RequestMetrics

DONE = "[DONE]"


def openai_finish_reason(reason: FinishReason | None) -> str | None:
    """OpenAI clients know stop and length; fairserve's own endings are passed through by name."""
    return None if reason is None else reason.value


def usage(m: RequestMetrics) -> dict[str, Any]:
    """The `usage` object, with cached prompt tokens in OpenAI's details field, split into hits on
    public-prefix blocks (shared by every tenant) and on the caller's own cache group's blocks."""
    return {
        "prompt_tokens": m.prompt_tokens,
        "completion_tokens": m.completion_tokens,
        "total_tokens": m.prompt_tokens + m.completion_tokens,
        "prompt_tokens_details": {
            "cached_tokens": m.cached_tokens,
            "public_cached_tokens": m.public_cached_tokens,
            "private_cached_tokens": m.cached_tokens - m.public_cached_tokens,
        },
    }


@dataclass(frozen=True)
class Shape:
    """Which endpoint a response is for, and the identifiers every body repeats."""

    chat: bool
    request_id: str
    model: str
    created: int

    @property
    def object(self) -> str:
        """The non-streaming `object` value."""
        return "chat.completion" if self.chat else "text_completion"

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.request_id, "object": obj, "created": self.created, "model": self.model}

    def body(self, text: str, reason: FinishReason | None, m: RequestMetrics) -> str:
        """The complete non-streaming response body."""
        finish = openai_finish_reason(reason)
        if self.chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish,
            }
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        out = self._head(self.object) | {"choices": [choice], "usage": usage(m)}
        return json.dumps(out, ensure_ascii=False)

    def chunk(
        self, delta_text: str, reason: FinishReason | None, first: bool, so_far: RequestMetrics | None = None
    ) -> str:
        """One stream event's JSON: a text delta, on the last one the finish reason, and with `so_far`
        the usage up to this event (`stream_options.continuous_usage_stats`)."""
        finish = openai_finish_reason(reason)
        if self.chat:
            delta: dict[str, Any] = (
                {"role": "assistant", "content": delta_text} if first else {"content": delta_text}
            )
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": delta_text, "logprobs": None, "finish_reason": finish}
            obj = "text_completion"
        out = self._head(obj) | {"choices": [choice]}
        if so_far is not None:
            out["usage"] = usage(so_far)
        return json.dumps(out, ensure_ascii=False)

    def usage_chunk(self, m: RequestMetrics) -> str:
        """The extra final event with empty choices and usage (`stream_options.include_usage`)."""
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return json.dumps(self._head(obj) | {"choices": [], "usage": usage(m)})


def sse(data: str) -> bytes:
    """Frame one server-sent event."""
    return f"data: {data}\n\n".encode()
