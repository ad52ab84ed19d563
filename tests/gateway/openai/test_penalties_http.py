"""The penalties and min-p through the official client over real HTTP on the real engine: accepted in range
(vLLM's `repetition_penalty` and `min_p` as extra body fields), and out of range a 400 naming the field."""

from __future__ import annotations

import openai
import pytest

from tests.gateway.conftest import Server


def _client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=server.keys["alice"], max_retries=0)


@pytest.mark.parametrize("stream", [False, True])
def test_penalties_and_min_p_are_served(server: Server, stream: bool) -> None:
    reply = _client(server).chat.completions.create(
        model=server.model,
        messages=[{"role": "user", "content": "say something, say something"}],
        max_tokens=8,
        presence_penalty=0.5,
        frequency_penalty=1.0,
        temperature=0.8,
        logit_bias={"5": -100},
        extra_body={"repetition_penalty": 1.3, "min_p": 0.05},
        stream=stream,
    )
    if isinstance(reply, openai.Stream):
        reasons = [c.choices[0].finish_reason for c in reply if c.choices]
        assert reasons[-1] in ("stop", "length")
    else:
        assert reply.usage is not None and 1 <= reply.usage.completion_tokens <= 8


@pytest.mark.parametrize(
    ("field", "value"),
    [("presence_penalty", 2.5), ("frequency_penalty", -2.5), ("repetition_penalty", 0.0), ("min_p", 2.0)],
)
def test_out_of_range_is_a_400_naming_the_field(server: Server, field: str, value: float) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        _client(server).chat.completions.create(
            model=server.model,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=2,
            extra_body={field: value},
        )
    assert refused.value.param == field and field in refused.value.message
