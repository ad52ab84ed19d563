"""A required or named tool call cut short by max_tokens is still a tool call (issue 56), over real HTTP with
the official client, streamed and whole, on the built-in model (its byte tokenizer spends a token per
character of the call's markup).

A call whose shortest form (markup, the required keys with the emptiest values, the closing tag, end of
sequence) fits in max_tokens closes within it, finish_reason "tool_calls" (the closing narrowing reserves the
wrapper's tail: engine/worker/grammar/closing.py). One that cannot fit ends finish_reason "length" with
`tool_calls` holding what was generated of the arguments, and never `<tool_call>` markup in content.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionFunctionToolParam

from tests.gateway.conftest import Server

WEATHER: ChatCompletionFunctionToolParam = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
SHORTEST = '<tool_call>\n{"name": "get_weather", "arguments": {"city":""}}\n</tool_call>'
CHOICES: dict[str, Any] = {
    "required": "required",
    "named": {"type": "function", "function": {"name": "get_weather"}},
}


def _shortest_tokens(server: Server) -> int:
    """The fewest tokens a whole call takes in the served model's own tokenizer, its end of sequence counted."""
    return len(server.state.engine.tokenizer.encode(SHORTEST, add_special_tokens=False)) + 1


def _call(
    server: Server, max_tokens: int, choice: str, stream: bool
) -> tuple[str | None, str | None, list[Any]]:
    """(finish_reason, content, [(name, arguments)]) of one chat reply, gathered from the stream if streamed."""
    api = openai.OpenAI(base_url=server.url + "/v1", api_key=server.keys["alice"], max_retries=0)
    kwargs: dict[str, Any] = {
        "model": server.model,
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": [WEATHER],
        "tool_choice": CHOICES[choice],
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "seed": max_tokens,
    }
    if not stream:
        out = api.chat.completions.create(**kwargs)
        assert out.usage is not None and out.usage.completion_tokens <= max_tokens
        message = out.choices[0].message
        calls = [
            (c.function.name, c.function.arguments) for c in message.tool_calls or [] if c.type == "function"
        ]
        return out.choices[0].finish_reason, message.content, calls
    content, finish = "", None
    gathered: dict[int, list[str]] = {}
    for chunk in api.chat.completions.create(**kwargs, stream=True):
        choice_ = chunk.choices[0]
        content += choice_.delta.content or ""
        for delta in choice_.delta.tool_calls or []:
            entry = gathered.setdefault(delta.index, ["", ""])
            if delta.function is not None:
                entry[0] += delta.function.name or ""
                entry[1] += delta.function.arguments or ""
        finish = choice_.finish_reason or finish
    return finish, content or None, [tuple(gathered[i]) for i in sorted(gathered)]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("choice", ["required", "named"])
@pytest.mark.parametrize("max_tokens", [32, 48, 64, 100])
def test_a_cut_short_call_is_still_a_tool_call(
    server: Server, max_tokens: int, choice: str, stream: bool
) -> None:
    finish, content, calls = _call(server, max_tokens, choice, stream)
    assert content is None or "<tool_call>" not in content and "</tool" not in content, content
    assert len(calls) == 1, (finish, content, calls)
    name, arguments = calls[0]
    assert name == "get_weather" and "<" not in arguments, arguments
    if _shortest_tokens(server) <= max_tokens:  # it fits: it closes, whole and valid
        assert finish == "tool_calls", (finish, arguments)
        assert isinstance(json.loads(arguments)["city"], str)
    else:  # it cannot: cut, but a call, holding what was generated of its arguments
        assert finish == "length"
        assert '{"city":"'.startswith(arguments) or arguments.startswith('{"city":"'), arguments


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_forced_reply_cut_before_its_name_has_no_markup_and_no_content(
    server: Server, stream: bool
) -> None:
    # Two tools both named get_...: 20 tokens end inside the head before the name tells them apart.
    time_tool: ChatCompletionFunctionToolParam = {
        "type": "function",
        "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
    }
    api = openai.OpenAI(base_url=server.url + "/v1", api_key=server.keys["alice"], max_retries=0)
    kwargs: dict[str, Any] = {
        "model": server.model,
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": [WEATHER, time_tool],
        "tool_choice": "required",
        "max_tokens": 20,
    }
    if stream:
        chunks = list(api.chat.completions.create(**kwargs, stream=True))
        assert not any(c.choices[0].delta.content for c in chunks)
        assert not any(c.choices[0].delta.tool_calls for c in chunks)
        assert chunks[-1].choices[0].finish_reason == "length"
    else:
        out = api.chat.completions.create(**kwargs)
        message = out.choices[0].message
        assert (out.choices[0].finish_reason, message.content, message.tool_calls) == ("length", None, None)
