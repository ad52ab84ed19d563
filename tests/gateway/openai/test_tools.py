"""Tools on chat completions over real HTTP on the real engine (the embedded model's template renders them):
required and named calls enforced by a grammar, parsed into tool_calls, streamed as delta.tool_calls, a tool
loop round-trips, and a malformed definition is a 400 naming its field."""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from openai.types.chat import ChatCompletionFunctionToolParam

from tests.gateway.conftest import Server

WEATHER: ChatCompletionFunctionToolParam = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 10}, "unit": {"enum": ["c", "f"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME: ChatCompletionFunctionToolParam = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "integer", "minimum": -12, "maximum": 12}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
SCHEMAS = {t["function"]["name"]: t["function"].get("parameters") for t in (WEATHER, TIME)}


def _body(server: Server, **kw: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    return {"model": server.model, "messages": messages, "tools": [WEATHER, TIME], "max_tokens": 300, **kw}


def _valid_calls(calls: list[dict[str, Any]], names: set[str]) -> None:
    assert calls
    for call in calls:
        assert call["type"] == "function" and call["id"].startswith("call_")
        assert call["function"]["name"] in names
        jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[call["function"]["name"]])


@pytest.mark.parametrize("parallel", [True, False])
def test_required_gives_valid_calls(server: Server, client: httpx.Client, parallel: bool) -> None:
    for seed in range(3):
        body = _body(server, tool_choice="required", parallel_tool_calls=parallel, temperature=1.0, seed=seed)
        resp = client.post("/v1/chat/completions", json=body, headers=server.headers("alice"))
        assert resp.status_code == 200, resp.text
        choice = resp.json()["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        calls = choice["message"]["tool_calls"]
        _valid_calls(calls, {"get_weather", "get_time"})
        assert parallel or len(calls) == 1
        assert len({c["id"] for c in calls}) == len(calls)


def test_a_named_function_is_the_one_called(server: Server, client: httpx.Client) -> None:
    choice_field = {"type": "function", "function": {"name": "get_time"}}
    resp = client.post(
        "/v1/chat/completions", json=_body(server, tool_choice=choice_field), headers=server.headers("alice")
    )
    assert resp.status_code == 200, resp.text
    calls = resp.json()["choices"][0]["message"]["tool_calls"]
    assert len(calls) == 1
    _valid_calls(calls, {"get_time"})


def test_auto_and_none_leave_text_as_content(server: Server, client: httpx.Client) -> None:
    for choice_field in ("auto", "none"):
        resp = client.post(
            "/v1/chat/completions",
            json=_body(server, tool_choice=choice_field, max_tokens=20),
            headers=server.headers("alice"),
        )
        assert resp.status_code == 200, resp.text
        message = resp.json()["choices"][0]["message"]
        assert (
            isinstance(message["content"], str) and "tool_calls" not in message
        )  # the random model calls nothing


def test_streamed_calls_follow_openais_index_and_fragment_protocol(
    server: Server, client: httpx.Client
) -> None:
    body = _body(server, tool_choice="required", stream=True, temperature=1.0, seed=7)
    calls: dict[int, dict[str, Any]] = {}
    finish = None
    with client.stream("POST", "/v1/chat/completions", json=body, headers=server.headers("alice")) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            finish = choice["finish_reason"] or finish
            for delta in choice["delta"].get("tool_calls", []):
                if delta["index"] not in calls:  # a call's first delta: id, type and name, then fragments
                    assert delta["id"].startswith("call_") and delta["type"] == "function"
                    calls[delta["index"]] = {
                        "id": delta["id"],
                        "type": "function",
                        "function": {"name": delta["function"]["name"], "arguments": ""},
                    }
                else:
                    assert set(delta) == {"index", "function"}
                calls[delta["index"]]["function"]["arguments"] += delta["function"]["arguments"]
    assert finish == "tool_calls" and sorted(calls) == list(range(len(calls)))
    _valid_calls(list(calls.values()), {"get_weather", "get_time"})


def test_a_tool_loop_round_trips_with_the_openai_client(server: Server) -> None:
    api = openai.OpenAI(base_url=server.url + "/v1", api_key=server.keys["alice"])
    messages: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
    first = api.chat.completions.create(
        model=server.model, messages=messages, tools=[WEATHER], tool_choice="required", max_tokens=300
    )
    message = first.choices[0].message
    assert message.tool_calls and first.choices[0].finish_reason == "tool_calls"
    call = message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather"
    messages.append(message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temp": 21})})
    answer = api.chat.completions.create(
        model=server.model, messages=messages, tools=[WEATHER], max_tokens=10
    )
    assert answer.choices[0].message.content is not None


@pytest.mark.parametrize(
    ("patch", "param"),
    [
        ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools.0.function.name"),
        ({"tools": [{"type": "function"}]}, "tools.0.function"),
        ({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}, "tools.0.type"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
            "tools.0.function.parameters",
        ),
        ({"tools": [WEATHER, WEATHER]}, "tools"),
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": [], "tool_choice": "required"}, "tool_choice"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages.0"),
    ],
)
def test_malformed_tools_are_a_400_naming_the_field(
    server: Server, client: httpx.Client, patch: dict[str, Any], param: str
) -> None:
    resp = client.post("/v1/chat/completions", json=_body(server, **patch), headers=server.headers("alice"))
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param


def test_parameters_the_engine_cannot_enforce_are_a_400(server: Server, client: httpx.Client) -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "not": {}}}}
    body = _body(server, tools=[tool], tool_choice="required")
    resp = client.post("/v1/chat/completions", json=body, headers=server.headers("alice"))
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == "tools" and "not" in resp.json()["error"]["message"]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_call_with_unbounded_arguments_closes_within_max_tokens(
    server: Server, client: httpx.Client, temperature: float
) -> None:
    """Nothing in these parameters ends the string or the number: the call closes in the budget's last
    stretch (engine/worker/grammar/closing.py) instead of being cut at max_tokens."""
    tool = {
        "type": "function",
        "function": {
            "name": "lookup",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
                "required": ["query", "limit"],
            },
        },
    }
    body = _body(
        server, tools=[tool], tool_choice="required", max_tokens=120, temperature=temperature, seed=3
    )
    resp = client.post("/v1/chat/completions", json=body, headers=server.headers("alice"))
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    arguments = json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"])
    jsonschema.validate(arguments, tool["function"]["parameters"])  # type: ignore[index]
