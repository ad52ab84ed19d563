"""Every JSON schema is served or refused with a 400 at compile, never a 500 at mask time (issue 54, point
2), over real HTTP with the official openai client: self-references, `$defs` cycles, a self-reference
required inside `items` or inside a required tool's parameters; and a hypothesis fuzz of valid bodies
whose schemas may refer to themselves never gets a 5xx."""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.gateway.conftest import Server

MESSAGES: list[Any] = [{"role": "user", "content": "JSON please."}]
CYCLES: dict[str, Any] = {
    "itself": {"$ref": "#"},
    "defs cycle": {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
    "required item": {"type": "array", "items": {"$ref": "#"}, "minItems": 1},
    "required property": {"type": "object", "properties": {"x": {"$ref": "#"}}, "required": ["x"]},
}
SERVED: dict[str, Any] = {
    "nested arrays": {"type": "array", "items": {"$ref": "#"}, "maxItems": 2},
    "tree": {
        "type": "object",
        "properties": {"children": {"type": "array", "items": {"$ref": "#"}, "maxItems": 1}},
        "required": ["children"],
        "additionalProperties": False,
    },
}


def _format(schema: Any) -> Any:
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema}}


@pytest.fixture()
def oa(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=server.keys["alice"], max_retries=0)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("name", list(CYCLES))
def test_a_schema_that_cannot_be_completed_is_a_400_at_compile(
    server: Server, oa: openai.OpenAI, name: str, stream: bool
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        oa.chat.completions.create(
            model=server.model,
            messages=MESSAGES,
            response_format=_format(CYCLES[name]),
            max_tokens=20,
            stream=stream,
        )
    assert info.value.param == "response_format.json_schema.schema"
    assert "can never be completed" in info.value.message


@pytest.mark.parametrize("parameters", [{"$ref": "#"}, CYCLES["required property"], CYCLES["defs cycle"]])
def test_a_required_tool_whose_parameters_cannot_be_completed_is_a_400(
    server: Server, oa: openai.OpenAI, parameters: dict[str, Any]
) -> None:
    tool: Any = {"type": "function", "function": {"name": "f", "parameters": parameters}}
    with pytest.raises(openai.BadRequestError) as info:
        oa.chat.completions.create(
            model=server.model, messages=MESSAGES, tools=[tool], tool_choice="required", max_tokens=40
        )
    assert info.value.param == "tools" and "can never be completed" in info.value.message


@pytest.mark.parametrize("name", list(SERVED))
def test_a_recursive_schema_with_a_way_out_is_served(server: Server, oa: openai.OpenAI, name: str) -> None:
    for seed in range(3):
        reply = oa.chat.completions.create(
            model=server.model,
            messages=MESSAGES,
            response_format=_format(SERVED[name]),
            max_tokens=200,
            seed=seed,
            temperature=1.0,
        )
        choice = reply.choices[0]
        if choice.finish_reason == "stop":
            jsonschema.validate(json.loads(choice.message.content or ""), SERVED[name])


_leaf = st.sampled_from(
    [
        {"type": "string", "maxLength": 4},
        {"type": "integer"},
        {"type": "boolean"},
        {"type": "null"},
        {"$ref": "#"},
    ]
) | st.just({"$ref": "#/$defs/a"})
_schemas = st.recursive(
    _leaf,
    lambda inner: st.one_of(
        st.builds(
            lambda props, required: {
                "type": "object",
                "properties": props,
                "required": [k for k in props if required],
            },
            st.dictionaries(st.sampled_from(["a", "b", "c"]), inner, max_size=3),
            st.booleans(),
        ),
        st.builds(
            lambda items, least: {"type": "array", "items": items, "minItems": least, "maxItems": 3},
            inner,
            st.integers(0, 2),
        ),
        st.builds(lambda alts: {"anyOf": alts}, st.lists(inner, min_size=1, max_size=3)),
    ),
    max_leaves=8,
)


@st.composite
def _schema(draw: st.DrawFn) -> Any:
    root = draw(_schemas)
    if isinstance(root, dict):
        root = {**root, "$defs": {"a": draw(_schemas)}}
    return root


def test_fuzzed_valid_bodies_with_recursive_schemas_never_get_a_5xx(server: Server) -> None:
    seen: set[int] = set()
    with httpx.Client(base_url=server.url, timeout=60) as client:

        @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(schema=_schema(), stream=st.booleans(), tool=st.booleans())
        def check(schema: Any, stream: bool, tool: bool) -> None:
            body: dict[str, Any] = {
                "model": server.model,
                "messages": MESSAGES,
                "max_tokens": 24,
                "stream": stream,
            }
            if tool:
                body["tools"] = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
                body["tool_choice"] = "required"
            else:
                body["response_format"] = _format(schema)
            resp = client.post("/v1/chat/completions", json=body, headers=server.headers("alice"))
            seen.add(resp.status_code)
            assert resp.status_code < 500, resp.text
            if resp.status_code >= 400:
                assert str(resp.json()["error"]["param"]).startswith(("response_format", "tools")), resp.text
            elif stream:
                assert '"engine_error"' not in resp.text and "grammar" not in resp.text, resp.text

        check()
    assert 200 in seen and 400 in seen
