"""What `transformers serve --continuous-batching` gives a gateway in front of it, found over real HTTP
on the embedded model (docs/upstream-deploy.md, "What each engine gives"): the official openai client
streams from it; usage only when asked with stream_options (continuous_usage_stats ignored); no /metrics;
no `data: [DONE]`; unknown fields refused; the client's X-Request-Id kept; a dropped stream aborted."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import openai

from bench.transformers_peer import TransformersServe


def client(engine: TransformersServe) -> openai.OpenAI:
    return openai.OpenAI(base_url=engine.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_it_serves_the_model_fairserve_model_init_writes_under_its_directory(
    transformers_engine: TransformersServe,
) -> None:
    ids = [m.id for m in client(transformers_engine).models.list().data]
    assert ids == [transformers_engine.model] and Path(ids[0]).name == "model"


def test_a_stream_through_the_official_client_carries_no_usage_unless_asked(
    transformers_engine: TransformersServe,
) -> None:
    chunks = list(
        client(transformers_engine).completions.create(
            model=transformers_engine.model, prompt="hello", max_tokens=6, stream=True
        )
    )
    text = [c.choices[0].text for c in chunks if c.choices and c.choices[0].text]
    assert 1 <= len(text) <= 6 and all(c.usage is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")


def test_include_usage_gives_one_usage_chunk_at_the_end_and_continuous_stats_are_ignored(
    transformers_engine: TransformersServe,
) -> None:
    chunks = list(
        client(transformers_engine).completions.create(
            model=transformers_engine.model,
            prompt="hello",
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"stream_options": {"include_usage": True, "continuous_usage_stats": True}},
        )
    )
    with_usage = [c for c in chunks if c.usage is not None]
    assert with_usage == [chunks[-1]] and chunks[-1].choices == []
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens == len("hello") + 1  # the byte tokenizer adds BOS
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    assert usage.completion_tokens == 6 or chunks[-2].choices[0].finish_reason == "stop"
    assert len(streamed.encode()) <= usage.completion_tokens


def test_a_chat_stream_through_the_official_client(transformers_engine: TransformersServe) -> None:
    chunks = list(
        client(transformers_engine).chat.completions.create(
            model=transformers_engine.model,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens <= 4


def test_it_has_no_metrics_and_ends_a_stream_without_done(transformers_engine: TransformersServe) -> None:
    assert httpx.get(transformers_engine.url + "/metrics").status_code == 404
    body = {"model": transformers_engine.model, "prompt": "x", "max_tokens": 2, "stream": True}
    with httpx.stream("POST", transformers_engine.url + "/v1/completions", json=body, timeout=60) as resp:
        events = [line for line in resp.iter_lines() if line.startswith("data: ")]
    assert events and "data: [DONE]" not in events


def test_it_refuses_fields_it_does_not_know_so_a_gateway_must_not_send_vllms(
    transformers_engine: TransformersServe,
) -> None:
    body = {"model": transformers_engine.model, "prompt": "x", "max_tokens": 2, "ignore_eos": True}
    resp = httpx.post(transformers_engine.url + "/v1/completions", json=body, timeout=60)
    assert resp.status_code == 422 and "ignore_eos" in resp.text


def test_it_keeps_the_clients_x_request_id(transformers_engine: TransformersServe) -> None:
    body = {"model": transformers_engine.model, "prompt": "x", "max_tokens": 2}
    resp = httpx.post(
        transformers_engine.url + "/v1/completions", json=body, headers={"X-Request-Id": "rid-7"}, timeout=60
    )
    assert resp.headers["x-request-id"] == "rid-7" and resp.json()["id"] == "rid-7"


def _stats_lines(engine: TransformersServe, after: int) -> list[tuple[int, int]]:
    """(running, waiting) of each 10 s stats line it logged after character `after` of its log."""
    found = re.findall(r"requests: (\d+) running, (\d+) waiting", engine.log()[after:])
    return [(int(r), int(w)) for r, w in found]


def _running_while_kept_streams(engine: TransformersServe, url: str, body: dict[str, object]) -> int | None:
    """Drop one long stream after its first event, then stream a second, just as long, to its end: the
    running count of the first stats line logged while the second went on, or None when no line came in
    time. A line counts only if 50 or more of the second stream's events followed it, so the second was
    surely still running when it was logged (its stats timer ticks every 10 s, whatever the requests do,
    and a 1900-token stream can end within 10 s on a fast host)."""
    with httpx.stream("POST", url, json=body, timeout=60) as dropped:
        assert next(line for line in dropped.iter_lines() if line.startswith("data: "))
    running, after_line = None, 0
    with httpx.stream("POST", url, json=body, timeout=60) as kept:
        lines = (line for line in kept.iter_lines() if line.startswith("data: "))
        assert next(lines)
        mark = len(engine.log())
        for _ in lines:
            if running is None and (found := _stats_lines(engine, mark)):
                running = found[0][0]
                assert found[0][1] == 0, "nothing waits: the engine has seats for both"
            elif running is not None:
                after_line += 1
    return running if after_line >= 50 else None


def test_a_client_that_drops_its_stream_aborts_the_request(transformers_engine: TransformersServe) -> None:
    """With no metrics, its own stats line tells: while a second long stream, started after the first one
    was dropped, still runs, it is the only one running (2 if the first one went on). An attempt whose
    second stream ended before any stats line says nothing and is made again."""
    url, model = transformers_engine.url + "/v1/completions", transformers_engine.model
    long: dict[str, object] = {"model": model, "prompt": "a long one", "max_tokens": 1900, "stream": True}
    for _ in range(8):
        running = _running_while_kept_streams(transformers_engine, url, long)
        if running is not None:
            assert running == 1
            return
    raise AssertionError("no stats line came while a 1900-token stream ran, in 8 tries")
