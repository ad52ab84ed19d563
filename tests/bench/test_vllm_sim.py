"""The engine simulator that stands in for vLLM (bench/vllm_sim): its protocol over real HTTP with the
official openai client, its FIFO batch, its vLLM metrics, and the abort on a client's disconnect."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest

from bench.vllm_sim.core import BatchEngine, State
from bench.vllm_sim.process import SimProcess, running_sim


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    with running_sim(max_num_seqs=4, step_ms=5) as s:
        yield s


def client(sim: SimProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=sim.url + "/v1", api_key="unused", max_retries=0)


def wait_for(condition: Callable[[], Any], timeout_s: float = 20.0) -> Any:
    """Poll `condition` until it returns something truthy; fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)
    return value


def metric(sim: SimProcess, name: str, **labels: str) -> float:
    text = httpx.get(sim.url + "/metrics").text
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} {labels} not in /metrics")


def record(sim: SimProcess, request_id: str) -> dict[str, Any] | None:
    return next((r for r in sim.requests() if r["id"] == request_id), None)


# The protocol, through the official client ---------------------------------------------------------


def test_models_lists_the_served_model_with_its_context(sim: SimProcess) -> None:
    models = client(sim).models.list().data
    assert [m.id for m in models] == ["sim"]
    assert httpx.get(sim.url + "/v1/models").json()["data"][0]["max_model_len"] == 4096


def test_completion_stream_without_stream_options_carries_no_usage(sim: SimProcess) -> None:
    chunks = list(client(sim).completions.create(model="sim", prompt="hello", max_tokens=5, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == "abcde"
    assert all(c.usage is None for c in chunks)
    assert [c.choices[0].finish_reason for c in chunks][-1] == "length"


def test_include_usage_adds_a_final_usage_chunk_with_no_choices(sim: SimProcess) -> None:
    chunks = list(
        client(sim).completions.create(
            model="sim", prompt="hello", max_tokens=4, stream=True, stream_options={"include_usage": True}
        )
    )
    *tokens, last = chunks
    assert all(c.usage is None for c in tokens) and len(tokens) == 4
    assert last.choices == [] and last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens, last.usage.total_tokens) == (5, 4, 9)


def test_continuous_usage_stats_puts_the_running_usage_on_every_chunk(sim: SimProcess) -> None:
    options = {"include_usage": True, "continuous_usage_stats": True}
    chunks = list(
        client(sim).completions.create(
            model="sim",
            prompt="hi",
            max_tokens=3,
            stream=True,
            extra_body={"stream_options": options},  # continuous_usage_stats is vLLM's, not the client's
        )
    )
    assert [c.usage.completion_tokens for c in chunks if c.usage] == [1, 2, 3, 3]


def test_chat_stream_sends_the_role_first_then_one_token_a_chunk(sim: SimProcess) -> None:
    chunks = list(
        client(sim).chat.completions.create(
            model="sim",
            messages=[{"role": "user", "content": "hi there"}],
            max_tokens=3,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "abc"
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == len("hi there")


def test_a_whole_response_carries_usage(sim: SimProcess) -> None:
    done = client(sim).chat.completions.create(
        model="sim", messages=[{"role": "user", "content": "x"}], max_completion_tokens=6
    )
    assert done.choices[0].message.content == "abcdef" and done.choices[0].finish_reason == "length"
    assert done.usage is not None and (done.usage.prompt_tokens, done.usage.completion_tokens) == (1, 6)


def test_the_engine_request_takes_the_client_x_request_id(sim: SimProcess) -> None:
    client(sim).completions.create(
        model="sim", prompt="p", max_tokens=2, extra_headers={"X-Request-Id": "mine-1"}
    )
    rec = record(sim, "mine-1")
    assert rec is not None and rec["state"] == "finished" and rec["completion_tokens"] == 2


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
        ({"prompt": "x", "n": 2}, "n"),
        ({"prompt": 5}, "prompt"),
        ({"prompt": "x" * 4096}, "prompt"),
    ],
)
def test_bad_requests_are_400_naming_the_field(sim: SimProcess, body: dict[str, Any], field: str) -> None:
    resp = httpx.post(sim.url + "/v1/completions", json={"model": "sim", **body})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == field


def test_an_unknown_model_is_404(sim: SimProcess) -> None:
    with pytest.raises(openai.NotFoundError):
        client(sim).completions.create(model="other", prompt="x", max_tokens=1)


def test_injected_faults_answer_before_any_token_then_stop(sim: SimProcess) -> None:
    sim.fail_next(1, 503)
    with pytest.raises(openai.InternalServerError):
        client(sim).completions.create(model="sim", prompt="x", max_tokens=1, stream=True)
    assert client(sim).completions.create(model="sim", prompt="x", max_tokens=1).choices[0].text == "a"


# Abort on disconnect ---------------------------------------------------------------------------------


def test_a_client_that_drops_a_stream_aborts_the_engine_request(sim: SimProcess) -> None:
    aborted = metric(sim, "vllm:request_success_total", finished_reason="abort")
    with httpx.stream(
        "POST",
        sim.url + "/v1/completions",
        json={"model": "sim", "prompt": "x", "max_tokens": 4000, "stream": True},
        headers={"X-Request-Id": "dropped-stream"},
    ) as resp:
        lines = resp.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
    rec = wait_for(lambda: (r := record(sim, "dropped-stream")) and r["state"] == "aborted" and r)
    assert 1 <= rec["completion_tokens"] < 4000
    assert metric(sim, "vllm:request_success_total", finished_reason="abort") == aborted + 1


def test_a_client_that_drops_a_whole_request_aborts_it_too(sim: SimProcess) -> None:
    async def drop() -> None:
        async with httpx.AsyncClient(base_url=sim.url) as http:
            body = {"model": "sim", "prompt": "x", "max_tokens": 4000}
            task = asyncio.create_task(
                http.post("/v1/completions", json=body, headers={"X-Request-Id": "dropped-whole"})
            )
            while not (
                (r := await asyncio.to_thread(record, sim, "dropped-whole")) and r["completion_tokens"]
            ):
                await asyncio.sleep(0.02)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(drop())
    rec = wait_for(lambda: (r := record(sim, "dropped-whole")) and r["state"] == "aborted" and r)
    assert rec["completion_tokens"] < 4000


# The batch: FIFO by request, one token per running request per step ---------------------------------


def test_the_batch_admits_first_come_first_served_and_steps_one_token_each() -> None:
    async def run() -> None:
        engine = BatchEngine(slots=2, step_s=1.0, kv_tokens=100)
        reqs = [engine.submit(10, 3, f"r{i}") for i in range(3)]
        engine.step()
        assert [r.state for r in reqs] == [State.RUNNING, State.RUNNING, State.WAITING]
        assert [r.completion_tokens for r in reqs] == [1, 1, 0]
        assert engine.kv_usage() == pytest.approx(22 / 100)
        engine.step()
        engine.step()
        assert [r.state for r in reqs] == [State.FINISHED, State.FINISHED, State.WAITING]
        engine.step()
        assert reqs[2].completion_tokens == 1 and reqs[2].state is State.RUNNING
        tokens = []
        while (i := reqs[0].outbox.get_nowait()) is not None:
            tokens.append(i)
        assert tokens == [0, 1, 2]

    asyncio.run(run())


def test_alone_the_engine_splits_tokens_by_request_count() -> None:
    """Three requests of A to every one of B, all queued: A gets three times B's tokens, whatever weights
    a gateway might have in mind."""

    async def run() -> None:
        engine = BatchEngine(slots=4, step_s=1.0, kv_tokens=10_000)
        owner = {}
        for i in range(40):
            owner[engine.submit(1, 5, f"q{i}").request_id] = "B" if i % 4 == 3 else "A"
        for _ in range(20):
            engine.step()
        got = {"A": 0, "B": 0}
        for rid, req in engine.requests.items():
            got[owner[rid]] += req.completion_tokens
        assert got["A"] == 3 * got["B"] and sum(got.values()) == 4 * 20

    asyncio.run(run())


def test_metrics_show_the_queue_and_the_batch_under_load() -> None:
    with running_sim(max_num_seqs=1, step_ms=50) as sim:
        with httpx.Client(base_url=sim.url, timeout=30) as http:
            streams = [
                http.stream(
                    "POST",
                    "/v1/completions",
                    json={"model": "sim", "prompt": "x", "max_tokens": 2000, "stream": True},
                )
                for _ in range(3)
            ]
            opened = [s.__enter__() for s in streams]
            try:
                wait_for(lambda: metric(sim, "vllm:num_requests_waiting") == 2)
                assert metric(sim, "vllm:num_requests_running") == 1
                assert 0 < metric(sim, "vllm:kv_cache_usage_perc") < 1
            finally:
                for s, r in zip(streams, opened, strict=True):
                    r.close()
                    s.__exit__(None, None, None)
        wait_for(lambda: metric(sim, "vllm:num_requests_running") == 0)
        assert metric(sim, "vllm:num_requests_waiting") == 0


def test_no_metrics_mode_answers_404() -> None:
    with running_sim(extra=["--no-metrics"]) as sim:
        assert httpx.get(sim.url + "/metrics").status_code == 404
        assert re.fullmatch(
            "a", client(sim).completions.create(model="sim", prompt="x", max_tokens=1).choices[0].text
        )
