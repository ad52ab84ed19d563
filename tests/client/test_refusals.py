"""Refusals that waiting cannot cure, as the official openai client meets them: answered once, not retried.

A request larger than its tenant's whole token quota, or whose own run exceeds its deadline on an idle
engine, can never succeed; the gateway answers 400 with its own code, `x-should-retry: false` and no
Retry-After (docs/gateway.md, "Refusals that waiting cannot cure"), so a client with retries left sends it once.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.client.conftest import Served

MODEL = "fairserve-tiny"


def _plain(served: Served, tenant: str, sent: list[Any]) -> openai.OpenAI:
    """The official client with its default-like retries, counting every request it sends."""
    http = openai.DefaultHttpxClient(event_hooks={"request": [sent.append]})
    return openai.OpenAI(
        base_url=served.base_url, api_key=served.keys[tenant], max_retries=3, http_client=http
    )


def test_a_request_larger_than_the_whole_quota_is_400_and_not_retried(served: Served) -> None:
    if "quota-200" not in served.keys:
        served.add_tenant("quota-200", tokens_per_minute=200)
    sent: list[Any] = []
    with pytest.raises(openai.BadRequestError) as err:  # no max_tokens: the whole context is reserved
        _plain(served, "quota-200", sent).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hello"}]
        )
    assert len(sent) == 1  # the client had three retries left and used none
    response = err.value.response
    assert response.headers.get("x-should-retry") == "false" and "retry-after" not in response.headers
    body = err.value.body
    assert isinstance(body, dict) and body["code"] == "quota_exceeds_limit" and body["param"] == "max_tokens"
    message = str(body["message"])
    assert "200 tokens per minute" in message and "reserves" in message
    asked = int(message.split("reserves ")[1].split(" ")[0])
    assert asked > 200  # what was asked for, named
    assert response.headers["ratelimit-policy"] == "200;w=60"


def test_a_request_within_the_quota_left_is_429_with_retry_after_naming_both(served: Served) -> None:
    if "quota-200" not in served.keys:
        served.add_tenant("quota-200", tokens_per_minute=200)
    client = openai.OpenAI(base_url=served.base_url, api_key=served.keys["quota-200"], max_retries=0)
    first = client.completions.create(
        model=MODEL, prompt="hi", max_tokens=150, extra_body={"ignore_eos": True}
    )
    assert first.usage is not None
    with pytest.raises(openai.RateLimitError) as err:
        client.completions.create(model=MODEL, prompt="hi", max_tokens=150)
    assert int(err.value.response.headers["retry-after"]) >= 1  # it fits once the first has left the window
    body = err.value.body
    assert isinstance(body, dict) and body["code"] == "quota_exceeded"
    assert "200 tokens per minute" in str(body["message"]) and "+ 150 to generate" in str(body["message"])


def test_a_deadline_shorter_than_the_request_own_run_is_400_and_not_retried(served: Served) -> None:
    sent: list[Any] = []
    client = _plain(served, "agent", sent)
    with pytest.raises(openai.BadRequestError) as err:  # 1500 decode steps on an empty queue, 100 ms
        client.completions.create(
            model=MODEL,
            prompt="too long for its deadline",
            max_tokens=1500,
            extra_body={"ignore_eos": True},
            extra_headers={"X-Timeout-Ms": "100"},
        )
    assert len(sent) == 1
    response = err.value.response
    assert response.headers.get("x-should-retry") == "false" and "retry-after" not in response.headers
    body = err.value.body
    assert isinstance(body, dict) and body["code"] == "deadline_unmeetable"
    assert "idle engine" in str(body["message"])
