"""Plain OpenAI calls through FairServe over real HTTP: streaming and chat work unchanged, with identity headers."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import openai
import pytest

from fairserve_client import AsyncFairServe, FairServe
from tests.client.conftest import Served

MODEL = "fairserve-tiny"


def test_streaming_and_chat_carry_key_deadline_and_workflow_headers(served: Served) -> None:
    sent: list[Any] = []
    deadline = datetime.now(UTC) + timedelta(minutes=5)
    client = FairServe(
        base_url=served.base_url,
        api_key=served.keys["agent"],
        deadline=deadline,
        workflow_run_id="wf-calls-1",
        http_client=openai.DefaultHttpxClient(event_hooks={"request": [sent.append]}),
    )
    stream = client.completions.create(
        model=MODEL,
        prompt="stream me",
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    text = ""
    usage = None
    for chunk in stream:
        text += "".join(c.text for c in chunk.choices)
        usage = chunk.usage or usage
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    assert usage is not None and usage.completion_tokens == 6 and text
    assert chat.choices[0].message.content is not None
    assert len(sent) == 2 and sent[0].headers["idempotency-key"] != sent[1].headers["idempotency-key"]
    for request in sent:
        assert request.headers["x-workflow-run-id"] == "wf-calls-1" and request.headers["x-attempt"] == "0"
        assert float(request.headers["x-deadline"]) == pytest.approx(deadline.timestamp(), abs=1e-3)
        assert "x-task-id" not in request.headers
    rows = served.ledger_rows(2, "workflow_run_id = :w", w="wf-calls-1")
    assert sorted(r["completion_tokens"] for r in rows) == sorted(
        [6, chat.usage.completion_tokens if chat.usage else -1]
    )


def test_async_client_stream_and_per_call_timeout_header_becomes_a_fixed_deadline(served: Served) -> None:
    sent: list[Any] = []

    async def record(request: Any) -> None:
        sent.append(request)

    async def scenario() -> str:
        client = AsyncFairServe(
            base_url=served.base_url,
            api_key=served.keys["agent"],
            http_client=openai.DefaultAsyncHttpxClient(event_hooks={"request": [record]}),
        )
        stream = await client.completions.create(
            model=MODEL, prompt="async", max_tokens=4, stream=True, extra_headers={"X-Timeout-Ms": "60000"}
        )
        text = "".join([c.choices[0].text async for c in stream if c.choices])
        await client.close()
        return text

    assert asyncio.run(asyncio.wait_for(scenario(), 60))
    assert "x-timeout-ms" not in sent[0].headers and float(sent[0].headers["x-deadline"]) > 0


def test_bad_deadlines_are_refused_before_sending() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        FairServe(base_url="http://127.0.0.1:9/v1", api_key="k", deadline=datetime(2030, 1, 1))
    with pytest.raises(ValueError, match="deadline_in"):
        FairServe(base_url="http://127.0.0.1:9/v1", api_key="k").with_options(deadline_in=-1)
