"""Request schemas: accepted OpenAI fields, refused features, and HTTP fuzzing that must never yield a 500."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from gateway.openai.responses_api.schemas import ResponsesRequest
from gateway.openai.schemas import ChatCompletionRequest, CompletionRequest, first_error
from tests.gateway.conftest import Server


def test_common_openai_fields_are_accepted() -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "n": 1,
        "user": "u1",
        "logprobs": False,
        "presence_penalty": 0,
        "frequency_penalty": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_completion_tokens": 5,
        "response_format": {"type": "text"},
        "tools": [],
        "seed": 3,
        "stop": "END",
    }
    req = ChatCompletionRequest.model_validate_json(json.dumps(body))
    assert req.include_usage and req.requested_max_tokens == 5
    assert req.messages[0].text() == "hi"
    params = req.sampling(req.requested_max_tokens)
    assert params.stop == ["END"] and params.seed == 3 and params.max_tokens == 5


@pytest.mark.parametrize(
    ("patch", "param"),
    [
        ({"n": "three"}, "n"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"tools": [{"type": "function"}]}, "tools.0.function"),
        ({"temperature": "hot"}, "temperature"),
        ({"extra_thing": 1}, "extra_thing"),
        ({"stream_options": {"include_usage": "yes"}}, "stream_options.include_usage"),
    ],
)
def test_refused_values_name_the_field(patch: dict[str, Any], param: str) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **patch}
    with pytest.raises(ValidationError) as info:
        ChatCompletionRequest.model_validate_json(json.dumps(body))
    got, message = first_error(info.value)
    assert got == param
    assert param.split(".")[-1] in message or "not supported" in message


def test_batched_prompts_refused() -> None:
    with pytest.raises(ValidationError):
        CompletionRequest.model_validate_json('{"model": "m", "prompt": ["a", "b"]}')
    assert CompletionRequest.model_validate_json('{"model": "m", "prompt": [1, 2, 3]}').prompt == [1, 2, 3]


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)
_fields = sorted(
    set(CompletionRequest.model_fields)
    | set(ChatCompletionRequest.model_fields)
    | set(ResponsesRequest.model_fields)
)
_plausible = {
    "max_tokens": st.integers(-3, 12) | st.just(10**7),
    "temperature": st.floats(-1, 3, allow_nan=False),
    "top_p": st.floats(-0.5, 1.5, allow_nan=False),
    "top_k": st.integers(-2, 50),
    "prompt": st.text(max_size=40) | st.lists(st.integers(-5, 400), max_size=8),
    "messages": st.lists(
        st.fixed_dictionaries(
            {"role": st.sampled_from(["user", "system", "x"]), "content": st.text(max_size=20)}
        ),
        max_size=3,
    ),
    "stream": st.booleans(),
    "stop": st.text(max_size=3) | st.lists(st.text(max_size=3), max_size=2),
    "seed": st.integers(-2, 2**31),
    "input": st.text(max_size=20)
    | st.lists(
        st.fixed_dictionaries(
            {"role": st.sampled_from(["user", "assistant", "x"]), "content": st.text(max_size=20)}
        )
        | st.fixed_dictionaries(
            {
                "type": st.just("function_call_output"),
                "call_id": st.text(max_size=6),
                "output": st.text(max_size=9),
            }
        )
        | st.fixed_dictionaries({"type": st.sampled_from(["input_image", "function_call", "reasoning"])}),
        max_size=3,
    ),
    "max_output_tokens": st.integers(-3, 12),
    "previous_response_id": st.text(max_size=10),
}


@st.composite
def bodies(draw: st.DrawFn, model: str) -> Any:
    chosen = draw(st.lists(st.sampled_from(_fields), unique=True, max_size=6))
    body: dict[str, Any] = {"model": draw(st.sampled_from([model, model, "other"]))}
    for name in chosen:
        body[name] = draw(_plausible[name] if name in _plausible and draw(st.booleans()) else _json)
    if draw(st.integers(0, 9)) == 0:
        body[draw(st.text(min_size=1, max_size=6))] = draw(_json)
    if draw(st.integers(0, 9)) == 0:
        return draw(_json)
    return body


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/v1/responses"])
def test_fuzzed_bodies_never_produce_a_500(server: Server, path: str) -> None:
    seen: set[int] = set()
    with httpx.Client(base_url=server.url, timeout=60) as client:

        @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(body=bodies(server.model), raw=st.booleans())
        def check(body: Any, raw: bool) -> None:
            headers = server.headers("alice", **{"X-Timeout-Ms": "3000", "Content-Type": "application/json"})
            content = (
                json.dumps(body).encode()
                if not raw
                else json.dumps(body).encode()[: max(1, len(json.dumps(body)) // 2)]
            )
            resp = client.post(path, content=content, headers=headers)
            seen.add(resp.status_code)
            assert resp.status_code < 500 or resp.status_code == 503, resp.text
            assert "Traceback" not in resp.text
            if resp.status_code >= 400:
                assert set(resp.json()["error"]) == {"message", "type", "param", "code"}

        check()
    assert 400 in seen
