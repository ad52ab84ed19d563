"""RunResponse, the reply that sends a Run's stream: its events in order, grouped into writes as
`stream_events_per_write` says, none dropped and none changed (the usage each one carries included)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import openai

from engine import FinishReason, RequestMetrics, RequestOutput
from gateway.openai.format import Shape
from gateway.openai.responses import RunResponse
from gateway.openai.runs import Run, RunFeed, RunSpec
from tests.gateway.conftest import Server


def output(i: int, finished: bool = False) -> RequestOutput:
    metrics = RequestMetrics(3, 0, i + 1, float(i + 1), 0, 0, 0, None, 0.0, 0.0, 0.0, None)
    reason = FinishReason.LENGTH if finished else None
    return RequestOutput(
        "req-1", [1, 2, 3], [i], list(range(i + 1)), str(i), str(i), finished, reason, metrics
    )


def stream_writes(events_per_write: int, outputs: int) -> list[bytes]:
    """The bodies RunResponse writes for a stream of `outputs` outputs fed one at a time, each fed only once
    the reply waits for the next (continuous usage on: every event carries its own usage)."""

    async def scenario() -> list[bytes]:
        spec = RunSpec("req-1", "t", None, Shape(False, "req-1", "m", 0), True, False, continuous_usage=True)
        run = Run(spec, events_per_write=events_per_write)
        feed = RunFeed(run, lambda: None)
        bodies: list[bytes] = []

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.body":
                bodies.append(message["body"])

        async def receive() -> dict[str, Any]:
            await asyncio.Event().wait()  # the client never hangs up
            return {}

        reply = asyncio.create_task(RunResponse(run, {})({"type": "http"}, receive, send))  # type: ignore[arg-type]
        for i in range(outputs):
            await until(lambda: bool(run._waiters))  # the reply waits for the run's next change
            feed(output(i, finished=i == outputs - 1))
        await reply
        return bodies

    return asyncio.run(scenario())


async def until(ready: Callable[[], bool]) -> None:
    """Let the other tasks run until `ready()`: a state the test waits for, not a time."""
    while not ready():
        await asyncio.sleep(0)


def events(bodies: list[bytes]) -> list[dict[str, Any]]:
    text = b"".join(bodies).decode()
    frames = [f.removeprefix("data: ") for f in text.split("\n\n") if f]
    assert frames[-1] == "[DONE]"
    return [json.loads(f) for f in frames[:-1]]


def test_one_event_a_write_by_default() -> None:
    bodies = stream_writes(1, 8)
    assert len(bodies) == 8  # the last event goes with [DONE]
    assert [e["choices"][0]["text"] for e in events(bodies)] == [str(i) for i in range(8)]


def test_events_per_write_groups_the_middle_events_and_holds_neither_end() -> None:
    one, grouped = stream_writes(1, 8), stream_writes(3, 8)
    # The first event at once; then 1-3 and 4-6 as three are ready; the last with [DONE] at the end.
    assert [b.count(b"data: ") for b in grouped] == [1, 3, 3, 2]
    assert b"".join(grouped) == b"".join(one)  # the same events in the same order, each with its usage
    usage = [e["usage"]["completion_tokens"] for e in events(grouped)]
    assert usage == list(range(1, 9))


def test_a_stream_ends_at_once_whatever_is_held() -> None:
    bodies = stream_writes(4, 3)  # fewer events than a write's worth: the end sends them
    assert [b.count(b"data: ") for b in bodies] == [1, 3]  # the first; events 2 and 3 with [DONE]
    assert [e["choices"][0]["text"] for e in events(bodies)] == ["0", "1", "2"]


def test_a_gateway_grouping_events_streams_the_same_tokens_and_usage(
    server: Server, gateway: Callable[..., Server]
) -> None:
    grouped = gateway(stream_events_per_write=4)
    streamed = []
    for srv in (server, grouped):
        oa = openai.OpenAI(base_url=srv.url + "/v1", api_key=srv.keys["alice"], max_retries=0)
        chunks = oa.completions.create(
            model=server.model,
            prompt="count to ten",
            max_tokens=10,
            temperature=0,
            stream=True,
            extra_body={
                "ignore_eos": True,
                "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            },
        )
        streamed.append([(c.choices[0].text if c.choices else None, c.usage) for c in chunks])
    assert streamed[0] == streamed[1] and streamed[1][-1][1] is not None
