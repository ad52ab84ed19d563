"""`logprobs` over real HTTP with the official client: OpenAI's shapes, streams carrying their own tokens'
entries, values of the distribution sampled from, and 400s naming the field.

The values themselves are compared with transformers' logits in tests/engine/test_engine_parity.py.
"""

from __future__ import annotations

import math
from typing import Any

import httpx
import openai
import pytest

from gateway.openai.logprobs import NO_PROBABILITY
from tests.gateway.conftest import Server


@pytest.fixture()
def oa(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=server.keys["alice"], max_retries=0)


def _is_logprob(value: float) -> bool:
    return value == NO_PROBABILITY or (math.isfinite(value) and value <= 1e-6)


def test_completion_logprobs_have_openais_legacy_shape(server: Server, oa: openai.OpenAI) -> None:
    comp = oa.completions.create(
        model=server.model,
        prompt="Hello",
        max_tokens=6,
        temperature=0,
        logprobs=3,
        extra_body={"ignore_eos": True},
    )
    choice = comp.choices[0]
    lp = choice.logprobs
    assert lp is not None and lp.tokens is not None and lp.token_logprobs is not None
    assert lp.top_logprobs is not None and lp.text_offset is not None
    assert comp.usage is not None and len(lp.tokens) == comp.usage.completion_tokens == 6
    assert len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 6
    offset = 0
    for token, value, top, at in zip(
        lp.tokens, lp.token_logprobs, lp.top_logprobs, lp.text_offset, strict=True
    ):
        assert at == offset
        offset += len(token)
        assert _is_logprob(value)
        # The three most likely, plus the sampled token: greedy, it is the most likely of them.
        assert 1 <= len(top) <= 4 and top[token] == value == max(top.values())
        assert all(_is_logprob(v) for v in top.values())


def test_chat_logprobs_have_openais_shape_and_streams_carry_their_tokens(
    server: Server, oa: openai.OpenAI
) -> None:
    ask: dict[str, Any] = {
        "model": server.model,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 8,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
        "extra_body": {"ignore_eos": True},
    }
    whole = oa.chat.completions.create(**ask)
    content = whole.choices[0].logprobs.content if whole.choices[0].logprobs else None
    assert content is not None and len(content) == 8
    for entry in content:
        assert bytes(entry.bytes or []).decode("utf-8", "replace") == entry.token or entry.token.startswith(
            "bytes:"
        )
        assert len(entry.top_logprobs) == 2
        assert entry.top_logprobs[0].token == entry.token and entry.top_logprobs[0].logprob == entry.logprob
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
    chunks = list(oa.chat.completions.create(**ask, stream=True))
    streamed = [
        e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content or []
    ]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in content]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    # Each chunk carries the entries of the tokens it brought (a token with no text yet rides the next).
    assert sum(1 for c in chunks if c.choices and c.choices[0].logprobs and c.choices[0].logprobs.content) > 1


def test_logprobs_follow_the_truncated_distribution(server: Server, oa: openai.OpenAI) -> None:
    """Sampled with top_k=2: the third and later alternatives have probability 0 (-9999.0), the two kept
    ones sum to probability 1, and the sampled token is one of them."""
    comp = oa.completions.create(
        model=server.model,
        prompt="Once",
        max_tokens=6,
        temperature=0.8,
        logprobs=4,
        seed=7,
        extra_body={"top_k": 2, "ignore_eos": True},
    )
    lp = comp.choices[0].logprobs
    assert lp is not None and lp.top_logprobs is not None and lp.tokens is not None
    for token, top in zip(lp.tokens, lp.top_logprobs, strict=True):
        kept = sorted((v for v in top.values() if v != NO_PROBABILITY), reverse=True)
        assert len(kept) == 2 and math.isclose(sum(math.exp(v) for v in kept), 1.0, rel_tol=1e-4)
        assert top[token] in kept
        assert list(top.values()).count(NO_PROBABILITY) >= 1  # four asked for, two possible


def test_no_logprobs_unless_asked(server: Server, oa: openai.OpenAI) -> None:
    comp = oa.completions.create(model=server.model, prompt="Hi", max_tokens=2)
    assert comp.choices[0].logprobs is None
    chat = oa.chat.completions.create(
        model=server.model, messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    assert chat.choices[0].logprobs is None


@pytest.mark.parametrize(
    ("path", "patch", "param"),
    [
        ("/v1/completions", {"logprobs": 6}, "logprobs"),
        ("/v1/completions", {"logprobs": -1}, "logprobs"),
        ("/v1/completions", {"logprobs": "3"}, "logprobs"),
        ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ("/v1/chat/completions", {"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
        ("/v1/chat/completions", {"top_logprobs": 3}, "top_logprobs"),
        ("/v1/chat/completions", {"logprobs": 2}, "logprobs"),
    ],
)
def test_bad_logprobs_are_400_naming_the_field(
    server: Server, client: httpx.Client, path: str, patch: dict[str, Any], param: str
) -> None:
    prompt: dict[str, Any] = (
        {"prompt": "hi"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "hi"}]}
    )
    body = {"model": server.model, "max_tokens": 2, **prompt, **patch}
    resp = client.post(path, json=body, headers=server.headers("alice"))
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param
