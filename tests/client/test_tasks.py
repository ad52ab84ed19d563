"""Tasks over real HTTP: an exception inside `client.task()` cancels the siblings on the server."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai
import pytest

from fairserve_client import AsyncFairServe, FairServe, Task
from tests.client.conftest import Served
from tests.gateway.conftest import wait_for

MODEL = "fairserve-tiny"
LONG = 1500


def test_an_exception_inside_task_cancels_the_siblings_and_the_ledger_reports_tokens_after_cancel(
    served: Served,
) -> None:
    client = FairServe(base_url=served.base_url, api_key=served.keys["agent"], max_retries=0)
    streaming = [threading.Event() for _ in range(3)]
    seen: dict[int, dict[str, Any]] = {}

    def sibling(task: Task, i: int) -> None:
        # A thread does not inherit the block's context, so it calls through the task's own client.
        stream = task.client.completions.create(
            model=MODEL,
            prompt=f"attempt {i} " * 4,
            max_tokens=LONG,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        for chunk in stream:
            streaming[i].set()
            if chunk.choices and chunk.choices[0].finish_reason:
                seen.setdefault(i, {})["finish_reason"] = chunk.choices[0].finish_reason
            if chunk.usage is not None:
                seen.setdefault(i, {})["completion_tokens"] = chunk.usage.completion_tokens

    with pytest.raises(RuntimeError, match="gave up"), ThreadPoolExecutor(3) as pool, client.task() as task:
        for i in range(3):
            pool.submit(sibling, task, i)
        # Two run (two engine slots, whichever two came first); the third waits in the queue.
        wait_for(lambda: sum(e.is_set() for e in streaming) >= 2, 60, "two siblings streaming")
        raise RuntimeError("the agent gave up")
    assert task.cancel_sent and len(task.cancelled) == 3
    assert [seen[i]["finish_reason"] for i in range(3)] == ["cancelled"] * 3
    rows = served.ledger_rows(3, "task_id = :t", t=task.id)
    assert len(rows) == 3 and {r["status"] for r in rows} == {"cancelled"}
    assert {r["request_id"] for r in rows} == set(task.cancelled)
    assert sorted(r["completion_tokens"] for r in rows) == sorted(
        seen[i]["completion_tokens"] for i in range(3)
    )
    for row in rows:
        assert row["completion_tokens"] < LONG
        assert (
            row["tokens_after_cancel"] is not None
            and 0 <= row["tokens_after_cancel"] <= row["completion_tokens"]
        )
    assert {r["cancel_state"] for r in rows} <= {"waiting", "prefill", "decode"}


def test_task_cancel_without_an_exception_and_a_task_with_nothing_live(served: Served) -> None:
    client = FairServe(base_url=served.base_url, api_key=served.keys["agent"], max_retries=0)
    with client.task() as task:
        out = client.completions.create(model=MODEL, prompt="quick", max_tokens=2)
        assert (
            task.cancel() == []
        )  # nothing of the task is live any more: a 404, reported as nothing cancelled
    assert out.choices[0].finish_reason in ("stop", "length")
    rows = served.ledger_rows(1, "task_id = :t", t=task.id)
    assert [r["status"] for r in rows] == ["completed"]


def test_async_task_cancels_a_streaming_sibling_when_another_coroutine_fails(served: Served) -> None:
    sent: list[Any] = []

    async def record(request: Any) -> None:
        sent.append(request)

    async def scenario() -> tuple[str | None, list[str], str]:
        http = openai.DefaultAsyncHttpxClient(event_hooks={"request": [record]})
        client = AsyncFairServe(
            base_url=served.base_url,
            api_key=served.keys["agent"],
            max_retries=0,
            http_client=http,
            # Far enough that the door's estimate of 1500 tokens on a slow CI host stays feasible: the stream is
            # cancelled long before it, and a 60 s deadline was refused there as infeasible (estimated 60.6 s).
            deadline_in=600,
        )
        started = asyncio.Event()

        async def long_stream() -> str | None:
            stream = await client.completions.create(
                model=MODEL,
                prompt="sibling " * 4,
                max_tokens=LONG,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            reason = None
            async for chunk in stream:
                started.set()
                if chunk.choices and chunk.choices[0].finish_reason:
                    reason = chunk.choices[0].finish_reason
            return reason

        sibling: asyncio.Task[str | None] | None = None
        with pytest.raises(RuntimeError, match="sub-agent"):
            async with client.task() as task:
                sibling = asyncio.create_task(
                    long_stream()
                )  # created inside the block: it carries the task id
                # Either the stream is running, or it ended first (refused, failed): then its error is the
                # test's failure, not a wait until the timeout.
                running = asyncio.create_task(started.wait())
                await asyncio.wait([running, sibling], return_when=asyncio.FIRST_COMPLETED)
                if not running.done():
                    running.cancel()
                    pytest.fail(f"the stream ended before its first chunk: {sibling.result()!r}")
                raise RuntimeError("sub-agent failed")
        assert sibling is not None
        reason = await sibling
        await client.close()
        return reason, task.cancelled, task.id

    reason, cancelled, task_id = asyncio.run(asyncio.wait_for(scenario(), 120))
    assert reason == "cancelled" and len(cancelled) == 1
    completion = [r for r in sent if r.url.path.endswith("/completions")]
    assert completion[0].headers["x-task-id"] == task_id and "idempotency-key" in completion[0].headers
    rows = served.ledger_rows(1, "task_id = :t", t=task_id)
    assert [r["status"] for r in rows] == ["cancelled"] and rows[0]["request_id"] == cancelled[0]
