"""The OpenAI wire format as vLLM speaks it: reading a request, writing chunks, usage and errors.

Only what a gateway in front of vLLM relies on is modelled; unknown fields are ignored, as vLLM ignores
them (it logs a warning), so a gateway may send `ignore_eos` or `seed` as it would to vLLM.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["completion", "chat"]


class BadRequest(ValueError):
    """A request vLLM would refuse with 400; the message names the field."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.param, self.status = param, status


@dataclass(frozen=True)
class Ask:
    """One parsed completion or chat completion request."""

    kind: Kind
    model: str
    prompt_tokens: int
    max_tokens: int
    stream: bool
    include_usage: bool
    continuous_usage: bool


def count_prompt(kind: Kind, body: dict[str, Any]) -> int:
    """Prompt tokens as a byte tokenizer counts them: UTF-8 bytes of the text (token ids: their number)."""
    if kind == "completion":
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            return len(prompt.encode())
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return len(prompt)
        raise BadRequest("prompt must be one string or one list of token ids", "prompt")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list", "messages")
    total = 0
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        parts = [content] if isinstance(content, str) else content if isinstance(content, list) else None
        if parts is None:
            raise BadRequest("each message needs a content string or a list of text parts", "messages")
        for part in parts:
            text = part if isinstance(part, str) else part.get("text") if isinstance(part, dict) else None
            if not isinstance(text, str):
                raise BadRequest("only text content parts are served", "messages")
            total += len(text.encode())
    return total


def _positive_int(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise BadRequest(f"{name} must be a positive integer", name)
    return value


def parse(kind: Kind, body: object, served: str, max_model_len: int) -> Ask:
    """Validate `body` as vLLM would for the one model `served`; BadRequest names the field."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    model = body.get("model", served)
    if model != served:
        raise BadRequest(f"The model `{model}` does not exist.", "model", status=404)
    if body.get("n", 1) != 1:
        raise BadRequest("only n = 1 is simulated", "n")
    prompt_tokens = count_prompt(kind, body)
    if prompt_tokens >= max_model_len:
        raise BadRequest(f"the prompt ({prompt_tokens} tokens) is longer than the context", "prompt")
    asked = _positive_int(body, "max_tokens")
    if kind == "chat":
        asked = _positive_int(body, "max_completion_tokens") or asked
    # vLLM's defaults: 16 for the legacy completions API, the rest of the context for chat.
    max_tokens = asked or (16 if kind == "completion" else max_model_len - prompt_tokens)
    if prompt_tokens + max_tokens > max_model_len:
        raise BadRequest("prompt + max_tokens is longer than the context", "max_tokens")
    stream = body.get("stream") is True
    options = body.get("stream_options")
    if options is not None and (not stream or not isinstance(options, dict)):
        raise BadRequest("Stream options can only be defined when `stream=True`.", "stream_options")
    options = options or {}
    include_usage = options.get("include_usage") is True
    continuous = include_usage and options.get("continuous_usage_stats") is True
    return Ask(kind, served, prompt_tokens, max_tokens, stream, include_usage, continuous)


def error_body(message: str, status: int, param: str | None = None) -> dict[str, Any]:
    """vLLM's error object (the OpenAI shape the official client parses)."""
    kind = {400: "BadRequestError", 404: "NotFoundError"}.get(status, "InternalServerError")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }


OBJECTS = {True: "chat.completion.chunk", False: "chat.completion"}  # chat's object names (completions: one)


class Writer:
    """The chunks of one response, in vLLM's shapes: completions or chat, streamed or whole."""

    def __init__(self, ask: Ask, request_id: str) -> None:
        self.ask = ask
        prefix = "cmpl-" if ask.kind == "completion" else "chatcmpl-"
        self.id, self.created = prefix + request_id, int(time.time())

    def _envelope(self, choices: list[dict[str, Any]], chunk: bool) -> dict[str, Any]:
        obj = "text_completion" if self.ask.kind == "completion" else OBJECTS[chunk]
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.ask.model,
            "choices": choices,
        }

    def _choice(self, text: str | None, finish: str | None, role: bool = False) -> dict[str, Any]:
        if self.ask.kind == "completion":
            return {
                "index": 0,
                "text": text or "",
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": None,
            }
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
        if text is not None:
            delta["content"] = text
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}

    def _sse(self, payload: dict[str, Any]) -> bytes:
        return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"

    def chunk(
        self, text: str | None, finish: str | None, completion_tokens: int, role: bool = False
    ) -> bytes:
        """One streamed chunk; with continuous_usage_stats it carries the usage so far, as vLLM's do."""
        payload = self._envelope([self._choice(text, finish, role)], chunk=True)
        if self.ask.continuous_usage:
            payload["usage"] = usage(self.ask.prompt_tokens, completion_tokens)
        elif self.ask.include_usage:
            payload["usage"] = None
        return self._sse(payload)

    def final_usage(self, completion_tokens: int) -> bytes:
        """The last chunk before [DONE] when include_usage was asked: no choices, the request's usage."""
        payload = self._envelope([], chunk=True) | {"usage": usage(self.ask.prompt_tokens, completion_tokens)}
        return self._sse(payload)

    def whole(self, text: str, finish: str, completion_tokens: int) -> dict[str, Any]:
        """The non-streamed response body."""
        if self.ask.kind == "completion":
            choice = self._choice(text, finish)
        else:
            message = {"role": "assistant", "content": text}
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
        return self._envelope([choice], chunk=False) | {
            "usage": usage(self.ask.prompt_tokens, completion_tokens)
        }
