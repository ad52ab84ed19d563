"""Retry-After that clients honour: at most 60 s with retry-after-ms beside it; longer waits are a clear 503."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from admission.backoff import RETRY_AFTER_CAP_S
from gateway.edge.errors import APIError
from tests.gateway.conftest import Server


def test_short_waits_keep_their_status_and_gain_retry_after_ms() -> None:
    err = APIError(
        429, "tenant queue is full", "tenant_queue_full", headers={"Retry-After": str(RETRY_AFTER_CAP_S)}
    )
    assert (
        err.status == 429 and err.headers["Retry-After"] == "60" and err.headers["retry-after-ms"] == "60000"
    )
    assert "x-should-retry" not in err.headers


def test_a_wait_over_the_cap_is_a_503_that_says_when_and_tells_clients_not_to_retry() -> None:
    err = APIError(
        429,
        "tenant token quota exceeded",
        "quota_exceeded",
        headers={"Retry-After": "3600", "RateLimit": "limit=1, remaining=0, reset=3600"},
    )
    assert err.status == 503 and err.code == "quota_exceeded"
    assert "Retry-After" not in err.headers and "retry-after-ms" not in err.headers
    assert err.headers["x-should-retry"] == "false" and err.headers["RateLimit"].endswith("reset=3600")
    assert "3600 s" in err.message and "60 s" in err.message and "do not retry before" in err.message


def test_a_drained_daily_quota_over_http_is_one_503_for_the_plain_openai_client(server: Server) -> None:
    server.add_tenant("daily", tokens_per_day=200)
    sent: list[Any] = []
    client = openai.OpenAI(
        base_url=server.url + "/v1",
        api_key=server.keys["daily"],
        max_retries=2,
        http_client=openai.DefaultHttpxClient(event_hooks={"request": [sent.append]}),
    )
    first = client.completions.create(
        model=server.model, prompt="hello", max_tokens=150, extra_body={"ignore_eos": True}
    )
    assert first.usage is not None and first.usage.completion_tokens == 150
    with pytest.raises(openai.InternalServerError) as exc:
        client.completions.create(model=server.model, prompt="hello", max_tokens=150)
    response = exc.value.response
    assert response.status_code == 503 and "retry-after" not in response.headers
    assert response.headers["x-should-retry"] == "false"
    assert isinstance(exc.value.body, dict) and exc.value.body["code"] == "quota_exceeded"
    assert "do not retry before" in exc.value.body["message"]
    assert len(sent) == 2  # the refused call was sent once: the SDK obeyed x-should-retry
