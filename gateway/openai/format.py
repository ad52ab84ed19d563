"""OpenAI response shapes: completion and chat bodies, stream chunks, usage, finish reasons."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from engine import FinishReason, RequestMetrics
from gateway.openai.tools import ToolStream, parse

DONE = "[DONE]"
_MARK = "fairserve-delta-7f3a"  # stands for the delta text while a middle event's fixed text is cut out
_ENCODER = msgspec.json.Encoder()


def _json(obj: Any) -> str:
    """Compact JSON text, non-ASCII as UTF-8 (`json.dumps(obj, ensure_ascii=False, separators=(",", ":"))`).

    msgspec, not the standard library: its encoder builds no encoder object and no cycle-check table per
    call, so a completion body costs 0.7 us against 5.6, and 11 against 37 right after an idle wait, which
    is when a reply runs (experiments/cold_code.py; docs/gateway.md, "Where the CPU goes, in place")."""
    return _ENCODER.encode(obj).decode()


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
    _around_cache: list[tuple[str, str] | None] = field(default_factory=list, compare=False, repr=False)
    # A chat offered tools: the reply's <tool_call> blocks become tool_calls (gateway/openai/tools.py).
    tools: ToolStream | None = field(default=None, compare=False, repr=False)
    # n > 1 with tools: the stream parser of each choice after the first (`tools` is choice 0's).
    _choice_tools: dict[int, ToolStream] = field(default_factory=dict, compare=False, repr=False)

    @property
    def object(self) -> str:
        """The non-streaming `object` value."""
        return "chat.completion" if self.chat else "text_completion"

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.request_id, "object": obj, "created": self.created, "model": self.model}

    def body(
        self,
        text: str,
        reason: FinishReason | None,
        m: RequestMetrics,
        logprobs: dict[str, Any] | None = None,
    ) -> str:
        """The complete non-streaming response body (`logprobs`: the choice's, gateway/openai/logprobs.py)."""
        return self.body_of([(text, reason, logprobs)], m)

    def body_of(self, choices: Sequence[Choice], m: RequestMetrics) -> str:
        """The complete non-streaming body of one or more choices (n > 1), indexed in order; `m` covers all."""
        listed = [self._choice(i, *choice) for i, choice in enumerate(choices)]
        return _json(self._head(self.object) | {"choices": listed, "usage": usage(m)})

    def _choice(
        self, index: int, text: str, reason: FinishReason | None, logprobs: dict[str, Any] | None
    ) -> dict[str, Any]:
        """One entry of a body's `choices` (with tools offered, its text parsed on its own)."""
        finish = openai_finish_reason(reason)
        if self.tools is not None:
            content, calls = parse(text, self.tools.parallel, self.tools.names)
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if calls:
                message["tool_calls"] = calls
                finish = "tool_calls" if reason is FinishReason.STOP else finish
            return {"index": index, "message": message, "logprobs": None, "finish_reason": finish}
        if self.chat:
            message = {"role": "assistant", "content": text}
            return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish}
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}

    def chunk(
        self,
        delta_text: str,
        reason: FinishReason | None,
        first: bool,
        so_far: RequestMetrics | None = None,
        logprobs: dict[str, Any] | None = None,
        index: int = 0,
    ) -> str:
        """One stream event's JSON: a text delta of choice `index`, on its last one the finish reason, and
        with `so_far` the usage up to this event (`stream_options.continuous_usage_stats`).

        A middle event (not the first, not the last, no usage) is the run's fixed text around the delta's
        JSON string: built once per run, it saves a dict and a whole encode per token."""
        if self.tools is not None:
            return self._tool_chunk(delta_text, reason, first, so_far, index)
        if index:
            return self._chunk(delta_text, reason, first, so_far, logprobs, index)
        if reason is None and not first and so_far is None and logprobs is None:
            around = self._around()
            if around is not None:
                return around[0] + _json(delta_text) + around[1]
        return self._chunk(delta_text, reason, first, so_far, logprobs)

    def _around(self) -> tuple[str, str] | None:
        """The text of a middle event before and after its delta string, or None if it cannot be split."""
        if not self._around_cache:  # built on the first middle event (frozen: the list is the cache)
            parts = self._chunk(_MARK, None, first=False).split(_json(_MARK))
            self._around_cache.append((parts[0], parts[1]) if len(parts) == 2 else None)
        return self._around_cache[0]

    def _chunk(
        self,
        delta_text: str,
        reason: FinishReason | None,
        first: bool,
        so_far: RequestMetrics | None = None,
        logprobs: dict[str, Any] | None = None,
        index: int = 0,
    ) -> str:
        finish = openai_finish_reason(reason)
        if self.chat:
            delta: dict[str, Any] = (
                {"role": "assistant", "content": delta_text} if first else {"content": delta_text}
            )
            choice: dict[str, Any] = {
                "index": index,
                "delta": delta,
                "logprobs": logprobs,
                "finish_reason": finish,
            }
            obj = "chat.completion.chunk"
        else:
            choice = {"index": index, "text": delta_text, "logprobs": logprobs, "finish_reason": finish}
            obj = "text_completion"
        out = self._head(obj) | {"choices": [choice]}
        if so_far is not None:
            out["usage"] = usage(so_far)
        return _json(out)

    def _tool_chunk(
        self,
        delta_text: str,
        reason: FinishReason | None,
        first: bool,
        so_far: RequestMetrics | None,
        index: int = 0,
    ) -> str:
        """A chat stream event when tools were offered: content and `tool_calls` deltas (gateway/openai/tools.py),
        each choice's text through a parser of its own."""
        tools = self.tools
        assert tools is not None
        if index:
            tools = self._choice_tools.setdefault(index, ToolStream(tools.parallel, tools.names))
        content, calls = tools.feed(delta_text, final=reason is not None)
        delta: dict[str, Any] = {"role": "assistant"} if first else {}
        if content or not calls:
            delta["content"] = content
        if calls:
            delta["tool_calls"] = calls
        finish = openai_finish_reason(reason)
        if reason is FinishReason.STOP and tools.called:
            finish = "tool_calls"
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
        out = self._head("chat.completion.chunk") | {"choices": [choice]}
        if so_far is not None:
            out["usage"] = usage(so_far)
        return _json(out)

    def usage_chunk(self, m: RequestMetrics) -> str:
        """The extra final event with empty choices and usage (`stream_options.include_usage`)."""
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return _json(self._head(obj) | {"choices": [], "usage": usage(m)})


Choice = tuple[str, FinishReason | None, dict[str, Any] | None]  # text, finish reason, logprobs


def sse(data: str) -> bytes:
    """Frame one server-sent event."""
    return f"data: {data}\n\n".encode()
