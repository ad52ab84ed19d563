"""A Run fed by RunFeed as the engine front would, and the idempotency publisher reading it."""

from __future__ import annotations

import asyncio
import json

import pytest

from engine import (
    DuplicateRequestError,
    EngineDeadError,
    FinishReason,
    PromptTooLongError,
    RequestMetrics,
    RequestOutput,
)
from gateway.openai.format import DONE, Shape
from gateway.openai.runs import Outcome, Run, RunFeed, RunSpec, publish_chunks


def spec(stream: bool) -> RunSpec:
    return RunSpec("req-1", "tenant-a", None, Shape(False, "req-1", "m", 0), stream, include_usage=False)


def output(i: int, text: str, finished: bool = False) -> RequestOutput:
    metrics = RequestMetrics(3, 0, i + 1, float(i + 1), 0, 0, 0, None, 0.0, 0.0, 0.0, None)
    return RequestOutput(
        "req-1",
        [1, 2, 3],
        [i],
        list(range(i + 1)),
        text,
        text,
        finished,
        FinishReason.LENGTH if finished else None,
        metrics,
    )


def test_a_stream_becomes_events_and_the_last_output_its_final_response_at_once() -> None:
    async def scenario() -> tuple[Run, Outcome, list[int]]:
        run = Run(spec(stream=True))
        started: list[int] = []
        feed = RunFeed(run, lambda: started.append(len(run.chunks)))
        woken = run.next_change()
        feed(output(0, "a"))
        assert woken.done() and len(run.chunks) == 1 and not run.done
        feed(output(1, "b", finished=True))
        feed(output(2, "late"))  # nothing after the end counts
        return run, await feed.outcome, started

    run, outcome, started = asyncio.run(scenario())
    assert started == [0]  # once, before the first event was added
    assert [json.loads(c)["choices"][0]["text"] for c in run.chunks] == ["a", "b"]
    assert run.final is not None and run.final.chunks == [*run.chunks, DONE]
    assert (
        outcome.status == "completed"
        and outcome.metrics is not None
        and outcome.metrics.completion_tokens == 2
    )


def test_a_whole_json_reply_wakes_its_reader_once_at_the_end_not_once_per_token() -> None:
    async def scenario() -> tuple[bool, bool, Run]:
        run = Run(spec(stream=False))
        feed = RunFeed(run, lambda: None)
        woken = run.next_change()
        for i in range(3):
            feed(output(i, "abc"[i]))
        during = woken.done()
        feed(output(3, "d", finished=True))
        return during, woken.done(), run

    during, after, run = asyncio.run(scenario())
    assert not during  # its middle outputs change nothing a whole-JSON reader sends
    assert after and run.final is not None and run.final.status == 200


@pytest.mark.parametrize(
    ("exc", "status", "code", "outcome"),
    [
        (DuplicateRequestError("live", "request_id"), 409, "duplicate_request_id", "rejected"),
        (PromptTooLongError("long", "prompt"), 400, "context_length_exceeded", "rejected"),
        (EngineDeadError("gone"), 503, "engine_unavailable", "error"),
        (KeyError("a gateway bug"), 500, "internal_error", "error"),
    ],
)
def test_an_error_ending_the_stream_becomes_its_status(
    exc: BaseException, status: int, code: str, outcome: str
) -> None:
    async def scenario() -> tuple[Run, Outcome]:
        run = Run(spec(stream=False))
        feed = RunFeed(run, lambda: None)
        feed(exc)
        return run, await feed.outcome

    run, ended = asyncio.run(scenario())
    assert run.error is not None and (run.error.status, run.error.code) == (status, code)
    assert ended.status == outcome and run.final is None


def test_publish_chunks_sends_every_event_in_order_however_slow_the_store() -> None:
    async def scenario() -> tuple[Run, list[str]]:
        run = Run(spec(stream=True))
        feed = RunFeed(run, lambda: None)
        published: list[str] = []
        entered, gate = asyncio.Event(), asyncio.Event()

        async def publish(chunk: str) -> None:
            entered.set()
            await gate.wait()  # the store answers only after more events have arrived
            published.append(chunk)

        feed(output(0, "0"))
        task = asyncio.create_task(publish_chunks(run, publish))
        await entered.wait()  # the first event is being published
        for i in range(1, 5):
            feed(output(i, str(i), finished=i == 4))
        assert run.done and not published  # the feed never waited for the store
        gate.set()
        await task
        return run, published

    run, published = asyncio.run(scenario())
    assert published == run.chunks and len(published) == 5


def _compact(obj: object) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


@pytest.mark.parametrize("chat", [False, True])
def test_events_and_bodies_are_the_json_of_their_fields_whatever_the_text(chat: bool) -> None:
    """Every event (first, middle, last) and the whole body are exactly the compact JSON of the OpenAI shape
    (json.dumps with ensure_ascii=False and no spaces), for text with quotes, escapes, non-ASCII and the
    JSON-hostile line separators."""
    shape = Shape(chat, "req-1", "m", 7)
    metrics = output(2, "x").metrics
    obj = "chat.completion.chunk" if chat else "text_completion"
    for text in ["plain", 'say "hi"\\', "tab\tnew\nline\x01", "été ☃ 🎉", "\u2028\u2029", ""]:
        for first, reason in [(True, None), (False, None), (False, FinishReason.LENGTH)]:
            if chat:
                delta = {"role": "assistant", "content": text} if first else {"content": text}
                choice = {
                    "index": 0,
                    "delta": delta,
                    "logprobs": None,
                    "finish_reason": reason and reason.value,
                }
            else:
                choice = {
                    "index": 0,
                    "text": text,
                    "logprobs": None,
                    "finish_reason": reason and reason.value,
                }
            want = {"id": "req-1", "object": obj, "created": 7, "model": "m", "choices": [choice]}
            assert shape.chunk(text, reason, first) == _compact(want)
        body = json.loads(shape.body(text, FinishReason.STOP, metrics))
        assert shape.body(text, FinishReason.STOP, metrics) == _compact(body)
        assert (body["choices"][0]["message"]["content"] if chat else body["choices"][0]["text"]) == text


def test_a_reader_waiting_for_events_sleeps_until_there_are_that_many_or_the_end() -> None:
    async def scenario() -> list[tuple[bool, bool]]:
        run = Run(spec(stream=True))
        feed = RunFeed(run, lambda: None)
        three, four, any_change = run.next_change(3), run.next_change(4), run.next_change()
        seen = []
        for i in range(3):
            feed(output(i, str(i)))
            seen.append((three.done(), any_change.done()))
        assert not four.done()  # three events, four awaited
        feed(output(3, "3", finished=True))
        assert four.done()  # the end wakes every reader, however many events it awaits
        return seen

    assert asyncio.run(scenario()) == [(False, True), (False, True), (True, True)]
