"""A body nested past `max_json_depth` is a 400 naming the limit and the field, at any depth, in any field,
on both endpoints, streamed or not (issue 54, point 3: 20,000 nested brackets were a 500 RecursionError,
a 180 KB nested response_format reset the connection), over real HTTP. Bodies this deep cannot go through
the official client (its JSON encoder recurses too), so they are sent as bytes; the client's own case is
one nested just past the limit."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.openai.body_depth import too_deep
from tests.gateway.conftest import Server

LIMIT = 64  # GatewaySettings.max_json_depth's default, which the shared server runs with
PATHS: dict[str, dict[str, Any]] = {
    "/v1/completions": {"prompt": "hi"},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}]},
}


def _nested(levels: int, leaf: bytes = b"1", opener: bytes = b"[", closer: bytes = b"]") -> bytes:
    return opener * levels + leaf + closer * levels


def _body(server: Server, path: str, field: str, value: bytes, stream: bool) -> bytes:
    head = json.dumps({"model": server.model, "max_tokens": 2, "stream": stream, **PATHS[path]})
    return head[:-1].encode() + b', "' + field.encode() + b'": ' + value + b"}"


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("stop", _nested(20_000)),  # the 500
        ("logit_bias", b'{"5": ' + _nested(20_000) + b"}"),
        ("response_format", _nested(30_000, b"{}", b'{"a":', b"}")),  # 180 KB: the connection reset
        ("user", _nested(LIMIT + 1)),  # just past the limit, under 32 KB
        ("no_such_field", _nested(100_000)),  # an unknown field is measured too
    ],
)
def test_a_body_nested_past_the_limit_is_a_400_naming_it(
    server: Server, client: httpx.Client, path: str, field: str, value: bytes, stream: bool
) -> None:
    content = _body(server, path, field, value, stream)
    resp = client.post(
        path, content=content, headers=server.headers("alice", **{"Content-Type": "application/json"})
    )
    assert resp.status_code == 400, resp.text[:300]
    error = resp.json()["error"]
    assert (
        error["param"] == field
        and "max_json_depth" in error["message"]
        and f"at most {LIMIT}" in error["message"]
    )


def test_the_official_client_is_told_the_limit(server: Server) -> None:
    oa = openai.OpenAI(base_url=server.url + "/v1", api_key=server.keys["alice"], max_retries=0)
    schema: dict[str, Any] = {"type": "object"}
    for _ in range(40):  # 2 levels each: 80 levels with the body's own
        schema = {"type": "object", "properties": {"a": schema}}
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as info:
            oa.chat.completions.create(
                model=server.model,
                messages=[{"role": "user", "content": "hi"}],
                response_format={"type": "json_schema", "json_schema": {"name": "deep", "schema": schema}},
                max_tokens=2,
                stream=stream,
            )
        assert info.value.param == "response_format" and "max_json_depth" in info.value.message


def test_nesting_within_the_limit_is_served(server: Server, client: httpx.Client) -> None:
    """A chat with content parts and a schema nested well within the limit are read as before."""
    schema: dict[str, Any] = {"type": "boolean"}
    for _ in range(10):
        schema = {
            "type": "object",
            "properties": {"a": schema},
            "required": ["a"],
            "additionalProperties": False,
        }
    body = {
        "model": server.model,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "ok", "schema": schema}},
        "max_tokens": 200,
    }
    resp = client.post("/v1/chat/completions", json=body, headers=server.headers("alice"))
    assert resp.status_code == 200, resp.text


def test_brackets_inside_strings_do_not_count() -> None:
    text = json.dumps({"prompt": "[" * 5000 + '\\"{' * 100, "stop": ["]]]"]}).encode()
    assert too_deep(text, 8) is None
    escaped = b'{"k\\"ey": ' + _nested(9) + b"}"
    found = too_deep(escaped, 8)
    assert found is not None and found.field == 'k"ey' and found.depth == 10


@pytest.mark.parametrize("path", list(PATHS))
def test_fuzzed_depths_are_400_past_the_limit_and_never_5xx(server: Server, path: str) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as client:

        @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(
            levels=st.integers(1, 3 * LIMIT) | st.integers(1_000, 30_000),
            field=st.sampled_from(["stop", "logit_bias", "response_format", "tools", "user", "seed"]),
            opener=st.sampled_from([(b"[", b"]"), (b'{"x":', b"}")]),
            stream=st.booleans(),
        )
        def check(levels: int, field: str, opener: tuple[bytes, bytes], stream: bool) -> None:
            content = _body(server, path, field, _nested(levels, b"1", *opener), stream)
            headers = server.headers("alice", **{"Content-Type": "application/json"})
            resp = client.post(path, content=content, headers=headers)
            assert resp.status_code < 500, resp.text[:300]
            deep = levels + 1 > LIMIT  # the body's own object is the first level
            assert (resp.status_code == 400 and "max_json_depth" in resp.text) == deep, resp.text[:300]

        check()
