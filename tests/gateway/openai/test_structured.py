"""Structured outputs over real HTTP on the real engine: response_format json_object and json_schema give
output that parses and validates, by constrained decoding; what the engine cannot enforce is a 400."""

from __future__ import annotations

import json
from typing import Any, cast

import httpx
import jsonschema
import openai
import pytest
from openai.types.shared_params import ResponseFormatJSONSchema
from pydantic import BaseModel, Field

from tests.gateway.conftest import Server

# Bounded strings and numbers: the embedded model is random, so an unbounded string could run to max_tokens.
PERSON: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 3},
    },
    "required": ["name", "age", "role", "tags"],
    "additionalProperties": False,
}


def _schema_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema, "strict": True}}


def _chat(server: Server, **kw: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": "Describe a person as JSON."}]
    return {"model": server.model, "messages": messages, "max_tokens": 200, **kw}


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_schema_output_parses_and_validates(
    server: Server, client: httpx.Client, temperature: float
) -> None:
    for seed in range(3):
        body = _chat(server, response_format=_schema_format(PERSON), temperature=temperature, seed=seed)
        resp = client.post("/v1/chat/completions", json=body, headers=server.headers("alice"))
        assert resp.status_code == 200, resp.text
        choice = resp.json()["choices"][0]
        assert choice["finish_reason"] == "stop"
        jsonschema.validate(json.loads(choice["message"]["content"]), PERSON)


def test_unconstrained_output_of_the_same_prompt_is_not_json(server: Server, client: httpx.Client) -> None:
    # The check above can fail: without a response_format the random model writes no JSON.
    resp = client.post(
        "/v1/chat/completions", json=_chat(server, temperature=0.0), headers=server.headers("alice")
    )
    with pytest.raises(json.JSONDecodeError):
        json.loads(resp.json()["choices"][0]["message"]["content"])


def test_json_object_and_completions(server: Server, client: httpx.Client) -> None:
    body = _chat(server, response_format={"type": "json_object"}, temperature=0.0)
    resp = client.post("/v1/chat/completions", json=body, headers=server.headers("alice"))
    assert resp.status_code == 200, resp.text
    assert isinstance(json.loads(resp.json()["choices"][0]["message"]["content"]), dict)
    body = {
        "model": server.model,
        "prompt": "x",
        "max_tokens": 200,
        "response_format": _schema_format(PERSON),
    }
    resp = client.post("/v1/completions", json=body, headers=server.headers("alice"))
    assert resp.status_code == 200, resp.text
    jsonschema.validate(json.loads(resp.json()["choices"][0]["text"]), PERSON)


def test_streamed_json_schema_output_validates(server: Server) -> None:
    api = openai.OpenAI(base_url=server.url + "/v1", api_key=server.keys["alice"])
    stream = api.chat.completions.create(
        model=server.model,
        messages=[{"role": "user", "content": "JSON please"}],
        max_tokens=200,
        response_format=cast(ResponseFormatJSONSchema, _schema_format(PERSON)),
        stream=True,
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    jsonschema.validate(json.loads(text), PERSON)


class Answer(BaseModel):
    city: str = Field(max_length=10)
    population: int = Field(ge=0, le=10_000)
    capital: bool


def test_openai_parse_returns_the_pydantic_object(server: Server) -> None:
    api = openai.OpenAI(base_url=server.url + "/v1", api_key=server.keys["alice"])
    completion = api.chat.completions.parse(
        model=server.model,
        messages=[{"role": "user", "content": "A city?"}],
        response_format=Answer,
        max_tokens=200,
    )
    parsed = completion.choices[0].message.parsed
    assert isinstance(parsed, Answer)
    assert 0 <= parsed.population <= 10_000


class Unbounded(BaseModel):
    """Nothing here ends the strings or the number: the output closes in its budget's last stretch."""

    name: str
    age: int
    tags: list[str]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_openai_parse_closes_an_unbounded_model_within_max_tokens(server: Server, temperature: float) -> None:
    api = openai.OpenAI(base_url=server.url + "/v1", api_key=server.keys["alice"])
    completion = api.chat.completions.parse(
        model=server.model,
        messages=[{"role": "user", "content": "A person?"}],
        response_format=Unbounded,
        max_tokens=150,
        temperature=temperature,
    )
    assert completion.choices[0].finish_reason == "stop"
    assert isinstance(completion.choices[0].message.parsed, Unbounded)
    assert completion.usage is not None and completion.usage.completion_tokens <= 150


@pytest.mark.parametrize(
    ("schema", "named"),
    [
        ({"not": {"type": "string"}}, "not"),
        ({"type": "array", "uniqueItems": True}, "uniqueItems"),
        ({"type": "string", "format": "no-such-format"}, "no-such-format"),
        ({"type": "no-such-type"}, "no-such-type"),
    ],
)
def test_what_the_engine_cannot_enforce_is_a_400_naming_it(
    server: Server, client: httpx.Client, schema: dict[str, Any], named: str
) -> None:
    for stream in (False, True):
        body = _chat(server, response_format=_schema_format(schema), stream=stream)
        resp = client.post("/v1/chat/completions", json=body, headers=server.headers("alice"))
        assert resp.status_code == 400, resp.text
        error = resp.json()["error"]
        assert error["param"] == "response_format.json_schema.schema"
        assert named in error["message"]


@pytest.mark.parametrize(
    "fmt",
    [
        {"type": "json_schema"},
        {"type": "json_object", "json_schema": {"name": "x", "schema": {}}},
        {"type": "json_schema", "json_schema": {"name": "has space", "schema": {}}},
        {"type": "yaml"},
    ],
)
def test_malformed_response_format_is_a_400(
    server: Server, client: httpx.Client, fmt: dict[str, Any]
) -> None:
    resp = client.post(
        "/v1/chat/completions", json=_chat(server, response_format=fmt), headers=server.headers("alice")
    )
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"].startswith("response_format")


def test_a_grammar_cannot_ignore_eos(server: Server, client: httpx.Client) -> None:
    body = _chat(server, response_format={"type": "json_object"}, ignore_eos=True)
    resp = client.post("/v1/chat/completions", json=body, headers=server.headers("alice"))
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == "ignore_eos"
