"""The HTTP contract of the app: errors, identity headers, OpenAI client compatibility, ops routes."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from tests.gateway.conftest import Server


def _assert_error(
    resp: httpx.Response, status: int, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert "Traceback" not in resp.text
    if code is not None:
        assert err["code"] == code
    if param is not None:
        assert err["param"] == param
    assert resp.headers.get("x-request-id")
    return err  # type: ignore[no-any-return]


def test_missing_and_wrong_key_are_401(server: Server, client: httpx.Client) -> None:
    body = {"model": server.model, "prompt": "hi", "max_tokens": 1}
    _assert_error(client.post("/v1/completions", json=body), 401, "invalid_api_key")
    _assert_error(
        client.post("/v1/completions", json=body, headers={"Authorization": "Bearer fsk_nope"}),
        401,
        "invalid_api_key",
    )
    _assert_error(client.get("/v1/models", headers={"Authorization": "Basic abc"}), 401, "invalid_api_key")


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"model": "nope", "prompt": "hi"}, "model", "model_not_found"),
        ({"prompt": "hi"}, "model", "invalid_value"),
        ({"model": "M", "prompt": "hi", "max_tokens": 0}, "max_tokens", "invalid_value"),
        ({"model": "M", "prompt": "hi", "max_tokens": -3}, "max_tokens", "invalid_value"),
        ({"model": "M", "prompt": "hi", "max_tokens": 10**9}, "max_tokens", "context_length_exceeded"),
        ({"model": "M", "prompt": "hi", "max_tokens": "5"}, "max_tokens", "invalid_value"),
        ({"model": "M", "prompt": "hi", "temperature": -1}, "temperature", "invalid_value"),
        ({"model": "M", "prompt": "hi", "top_p": 0}, "top_p", "invalid_value"),
        ({"model": "M", "prompt": "hi", "n": 9}, "n", "invalid_value"),  # over RequestCaps.max_n
        ({"model": "M", "prompt": "hi", "presence_penalty": 2.5}, "presence_penalty", "invalid_value"),
        ({"model": "M", "prompt": "hi", "frequency_penalty": -3}, "frequency_penalty", "invalid_value"),
        ({"model": "M", "prompt": "hi", "repetition_penalty": 0}, "repetition_penalty", "invalid_value"),
        ({"model": "M", "prompt": "hi", "repetition_penalty": 101}, "repetition_penalty", "invalid_value"),
        ({"model": "M", "prompt": "hi", "min_p": 1.5}, "min_p", "invalid_value"),
        ({"model": "M", "prompt": "hi", "min_p": "0.1"}, "min_p", "invalid_value"),
        ({"model": "M", "prompt": "hi", "logprobs": 6}, "logprobs", "invalid_value"),
        ({"model": "M", "prompt": "hi", "frobnicate": True}, "frobnicate", "invalid_value"),
        ({"model": "M", "prompt": 7}, "prompt", "invalid_value"),
        ({"model": "M", "prompt": "x" * 50_000}, "prompt", "context_length_exceeded"),
    ],
)
def test_bad_completion_bodies_are_400_naming_the_field(
    server: Server, client: httpx.Client, body: dict[str, Any], param: str, code: str
) -> None:
    if body.get("model") == "M":
        body = {**body, "model": server.model}
    resp = client.post("/v1/completions", json=body, headers=server.headers("alice"))
    err = _assert_error(resp, 404 if code == "model_not_found" else 400, code, param)  # 404 as OpenAI answers
    assert param in err["message"] or code in ("context_length_exceeded", "model_not_found")


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ([], "messages"),
        ([{"role": "robot", "content": "hi"}], "messages.0.role"),
        ([{"role": "user", "content": 5}], "messages.0.content"),
        ([{"role": "user"}], "messages.0.content"),
    ],
)
def test_bad_chat_messages_are_400(
    server: Server, client: httpx.Client, messages: list[Any], param: str
) -> None:
    resp = client.post(
        "/v1/chat/completions",
        json={"model": server.model, "messages": messages},
        headers=server.headers("alice"),
    )
    _assert_error(resp, 400, "invalid_value", param)


def test_malformed_json_and_non_object(server: Server, client: httpx.Client) -> None:
    h = server.headers("alice", **{"Content-Type": "application/json"})
    _assert_error(client.post("/v1/completions", content=b'{"model": ', headers=h), 400, "invalid_json")
    _assert_error(client.post("/v1/completions", content=b"[1, 2]", headers=h), 400, "invalid_json")
    _assert_error(client.post("/v1/completions", content=b"", headers=h), 400, "invalid_json")


def test_oversized_body_is_413(server: Server, client: httpx.Client) -> None:
    big = {"model": server.model, "prompt": "a" * (server.state.settings.max_body_bytes + 10)}
    _assert_error(
        client.post("/v1/completions", json=big, headers=server.headers("alice")), 413, "request_too_large"
    )


def test_unknown_route_and_method(client: httpx.Client) -> None:
    _assert_error(client.get("/v1/nothing"), 404, "not_found")
    _assert_error(client.get("/v1/completions"), 405, "method_not_allowed")


def test_request_id_is_echoed_or_generated(server: Server, client: httpx.Client) -> None:
    mine = client.get("/healthz", headers={"X-Request-Id": "trace-123"})
    assert mine.headers["x-request-id"] == "trace-123"
    generated = client.get("/healthz", headers={"X-Request-Id": "bad id with spaces"})
    assert generated.headers["x-request-id"] not in ("", "bad id with spaces")
    assert client.get("/nope").headers["x-request-id"]


def test_identity_headers_reach_the_ledger(server: Server, client: httpx.Client) -> None:
    h = server.headers(
        "alice",
        **{
            "X-Request-Id": "ident-1",
            "X-Task-Id": "task-ident",
            "X-Workflow-Run-Id": "wf-9",
            "X-Attempt": "3",
        },
    )
    resp = client.post(
        "/v1/completions", json={"model": server.model, "prompt": "hi", "max_tokens": 2}, headers=h
    )
    assert resp.status_code == 200, resp.text
    assert resp.json()["id"] == "ident-1" == resp.headers["x-request-id"]
    rows = server.usage_rows("request_id = :r", r="ident-1")
    assert len(rows) == 1
    row = rows[0]
    assert (row["task_id"], row["workflow_run_id"], row["attempt"]) == ("task-ident", "wf-9", 3)
    assert row["tenant_id"] == server.tenants["alice"].id
    assert row["status"] == "completed" and row["completion_tokens"] == 2
    # Reusing the id would lose the second request's ledger row: refused, found both in this process's
    # recent ids and (after the flush above) in SQL.
    again = client.post(
        "/v1/completions", json={"model": server.model, "prompt": "hi", "max_tokens": 2}, headers=h
    )
    _assert_error(again, 409, "duplicate_request_id", "X-Request-Id")
    assert len(server.usage_rows("request_id = :r", r="ident-1")) == 1
    _assert_error(
        client.post(
            "/v1/completions",
            json={"model": server.model, "prompt": "hi"},
            headers=server.headers("alice", **{"X-Attempt": "-1"}),
        ),
        400,
        "invalid_header",
        "X-Attempt",
    )


def test_openai_client_non_streaming_and_streaming(server: Server) -> None:
    oa = openai.OpenAI(base_url=server.url + "/v1", api_key=server.keys["alice"], max_retries=0)
    assert [m.id for m in oa.models.list().data] == [server.model]
    comp = oa.completions.create(model=server.model, prompt="Hello", max_tokens=4, temperature=0)
    assert comp.choices[0].finish_reason in ("stop", "length")
    assert (
        comp.usage is not None and comp.usage.completion_tokens == len(comp.choices[0].text.encode()) or True
    )
    assert comp.usage is not None and 1 <= comp.usage.completion_tokens <= 4
    chat = oa.chat.completions.create(
        model=server.model, messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    assert chat.choices[0].message.role == "assistant"
    assert chat.usage is not None and chat.usage.prompt_tokens > 0
    chunks = list(
        oa.chat.completions.create(
            model=server.model,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=5,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].usage is not None and chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == 5 or chunks[-2].choices[0].finish_reason == "stop"
    greedy = oa.chat.completions.create(
        model=server.model, messages=[{"role": "user", "content": "hi"}], max_tokens=5, temperature=0
    )
    assert greedy.choices[0].message.content == text  # streaming and non-streaming agree under greedy
    stream = list(oa.completions.create(model=server.model, prompt="Hello", max_tokens=3, stream=True))
    assert stream[-1].choices[0].finish_reason in ("stop", "length")
    assert all(c.usage is None for c in stream)


def test_raw_sse_ends_with_done(server: Server, client: httpx.Client) -> None:
    body = {"model": server.model, "prompt": "x", "max_tokens": 3, "stream": True}
    with client.stream("POST", "/v1/completions", json=body, headers=server.headers("alice")) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = [line for line in resp.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    payloads = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert payloads[-1]["choices"][0]["finish_reason"] is not None


def test_continuous_usage_stats_puts_usage_in_every_chunk(server: Server, client: httpx.Client) -> None:
    body = {
        "model": server.model,
        "prompt": "count",
        "max_tokens": 6,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"continuous_usage_stats": True},
    }
    with client.stream("POST", "/v1/completions", json=body, headers=server.headers("alice")) as resp:
        events = [line for line in resp.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    payloads = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert len(payloads) >= 2 and all(p["choices"] for p in payloads)  # no separate usage-only event
    done = [p["usage"]["completion_tokens"] for p in payloads]
    assert done == sorted(done) and done[-1] == 6
    assert {p["usage"]["prompt_tokens"] for p in payloads} == {payloads[0]["usage"]["prompt_tokens"]} != {0}
    assert all(
        p["usage"]["total_tokens"] == p["usage"]["prompt_tokens"] + p["usage"]["completion_tokens"]
        for p in payloads
    )


def test_ops_routes(server: Server, client: httpx.Client) -> None:
    health = client.get("/healthz").json()
    assert health["status"] == "ok" and health["pid"] > 0 and set(health) == {"status", "pid"}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["checks"] == {
        "engine": True,
        "database": True,
        "admitting": True,
    }
    assert ready.json()["degraded"] == [] and ready.json()["dependencies"] == {}  # no Redis configured
    client.post(
        "/v1/completions",
        json={"model": server.model, "prompt": "m", "max_tokens": 1},
        headers=server.headers("bob"),
    )
    text = client.get("/metrics", headers={"Authorization": f"Bearer {server.state.metrics_token}"}).text
    for name in (
        "fairserve_ttft_seconds_bucket",
        "fairserve_e2e_seconds_count",
        "fairserve_queue_seconds_count",
        "fairserve_requests_total",
        "fairserve_tokens_total",
        "fairserve_charged_service_total",
        "fairserve_kv_blocks_total",
        "fairserve_batch_size",
        "fairserve_waiting_requests",
        "fairserve_preemptions_total",
        "fairserve_iteration_seconds",
        'fairserve_quota_backend_unavailable_total{op="reserve",outcome="allowed"} 0.0',
    ):
        assert name in text, name
    assert 'fairserve_requests_total{status="completed",tenant="bob"}' in text


def test_unconfigured_tenants_share_the_other_label(server: Server) -> None:
    labels = server.state.metrics.labels
    assert labels.label(server.tenants["bob"].id) == "bob"
    assert labels.label("someone-unknown") == "other"


def test_admin_page_and_token(server: Server, client: httpx.Client) -> None:
    page = client.get("/admin")
    assert page.status_code == 200 and "<html" in page.text
    _assert_error(client.get("/admin/api/engine"), 401)
    _assert_error(client.get("/admin/api/engine", headers=server.headers("alice")), 403, "forbidden")
    ok = client.get("/admin/api/engine", headers={"Authorization": f"Bearer {server.state.admin_token}"})
    assert ok.status_code == 200 and ok.json()["model"] == server.model
    token_file = server.state.settings.data_dir / "admin_token"
    assert token_file.read_text().strip() == server.state.admin_token
    assert token_file.stat().st_mode & 0o077 == 0


def test_many_concurrent_streams_all_finish(server: Server) -> None:
    """Readers must never miss the run's last change (a lost wake-up would hang a stream forever)."""
    import asyncio

    async def one(client: httpx.AsyncClient, i: int) -> list[str]:
        body = {"model": server.model, "prompt": f"s{i}", "max_tokens": 6, "ignore_eos": True, "stream": True}
        async with client.stream("POST", "/v1/completions", json=body, headers=server.headers("bob")) as resp:
            return [line async for line in resp.aiter_lines() if line]

    async def scenario() -> list[list[str]]:
        async with httpx.AsyncClient(base_url=server.url, timeout=httpx.Timeout(60)) as client:
            return await asyncio.wait_for(asyncio.gather(*(one(client, i) for i in range(40))), 90)

    results = asyncio.run(scenario())
    assert len(results) == 40
    for events in results:
        assert events[-1] == "data: [DONE]"
        assert json.loads(events[-2][6:])["choices"][0]["finish_reason"] == "length"  # 6 tokens, ignore_eos


def test_server_timing_reports_the_engine_share(server: Server, client: httpx.Client) -> None:
    body = {"model": server.model, "prompt": "x", "max_tokens": 3, "ignore_eos": True}
    whole = client.post("/v1/completions", json=body, headers=server.headers("alice"))
    assert whole.status_code == 200, whole.text
    name, dur = whole.headers["server-timing"].split(";")
    # The engine's share is a part of the whole (how large a part is a benchmark's business).
    assert name == "engine" and 0 <= float(dur.removeprefix("dur=")) <= whole.elapsed.total_seconds() * 1e3
    with client.stream(
        "POST", "/v1/completions", json={**body, "stream": True}, headers=server.headers("alice")
    ) as s:
        name, dur = s.headers["server-timing"].split(";")
        assert name == "engine-first" and float(dur.removeprefix("dur=")) > 0
        assert [line for line in s.iter_lines() if line][-1] == "data: [DONE]"
    refused = client.post("/v1/completions", json={**body, "max_tokens": 0}, headers=server.headers("alice"))
    assert refused.status_code == 400 and "server-timing" not in refused.headers  # no engine work, no share
