"""Idempotency: the memory store, and replay / attach / mismatch / isolation over real HTTP."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from typing import Any

import httpx

from gateway.idempotency.records import MemoryIdempotencyStore, StoredResponse, fingerprint
from tests.gateway.conftest import Server, wait_for


def test_fingerprint_ignores_key_order_and_spacing_but_not_values() -> None:
    a = fingerprint("/v1/completions", json.loads('{"a": 1, "b": [1, 2]}'))
    b = fingerprint("/v1/completions", json.loads('{"b":[1,2],"a":1}'))
    assert a == b
    assert a != fingerprint("/v1/completions", {"a": 2, "b": [1, 2]})
    assert a != fingerprint("/v1/chat/completions", {"a": 1, "b": [1, 2]})


def test_memory_store_states_and_ttl() -> None:
    now = [0.0]
    store = MemoryIdempotencyStore(ttl_s=100.0, clock=lambda: now[0])
    done = StoredResponse(200, "json", ['{"ok": true}'], {"X-Request-Id": "r1"})

    async def scenario() -> None:
        assert (await store.claim("t1", "k", "fp", "r1")).outcome == "new"
        attach = await store.claim("t1", "k", "fp", "r2")
        assert (attach.outcome, attach.request_id) == ("attach", "r1")
        assert (await store.claim("t1", "k", "other", "r3")).outcome == "mismatch"
        assert (
            await store.claim("t2", "k", "fp", "r4")
        ).outcome == "new"  # another tenant's key never matches
        await store.finish("t1", "k", done)
        replay = await store.claim("t1", "k", "fp", "r5")
        assert replay.outcome == "replay" and replay.response == done
        now[0] = 99.0
        assert (await store.claim("t1", "k", "fp", "r6")).outcome == "replay"
        now[0] = 101.0
        assert (await store.claim("t1", "k", "fp", "r7")).outcome == "new"  # expired
        await store.abandon("t1", "k")
        assert (await store.claim("t1", "k", "fp", "r8")).outcome == "new"

    asyncio.run(scenario())


def _post(server: Server, tenant: str, key: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    with httpx.Client(base_url=server.url, timeout=60) as c:
        return c.post(
            "/v1/completions",
            json=body,
            headers=server.headers(tenant, **{"Idempotency-Key": key}, **headers),
        )


def test_replay_finished_json_without_engine_work(server: Server) -> None:
    key = uuid.uuid4().hex
    body = {"model": server.model, "prompt": "replay me", "max_tokens": 3, "temperature": 1.0}
    first = _post(server, "alice", key, body, **{"X-Request-Id": "idem-json"})
    assert first.status_code == 200
    iterations = server.state.engine.stats().iterations
    again = _post(server, "alice", key, body, **{"X-Request-Id": "idem-json-retry"})
    assert again.status_code == 200
    assert again.json() == first.json()  # sampled with temperature 1: only a replay is identical
    assert again.headers["idempotent-replayed"] == "true"
    assert again.headers["x-request-id"] == "idem-json"
    assert server.state.engine.stats().iterations == iterations
    assert server.usage_rows("request_id = 'idem-json-retry'") == []


def test_same_key_different_body_is_422(server: Server) -> None:
    key = uuid.uuid4().hex
    body = {"model": server.model, "prompt": "one", "max_tokens": 1}
    assert _post(server, "alice", key, body).status_code == 200
    resp = _post(server, "alice", key, {**body, "prompt": "two"})
    assert resp.status_code == 422
    assert resp.json()["error"]["code"] == "idempotency_key_reused"


def test_key_of_another_tenant_never_matches(server: Server) -> None:
    key = uuid.uuid4().hex
    body = {"model": server.model, "prompt": "mine", "max_tokens": 3}
    a = _post(server, "alice", key, body, **{"X-Request-Id": "iso-a"})
    b = _post(server, "bob", key, body, **{"X-Request-Id": "iso-b"})
    assert a.status_code == b.status_code == 200
    assert "idempotent-replayed" not in b.headers
    assert b.headers["x-request-id"] == "iso-b"
    assert len(server.usage_rows("request_id IN ('iso-a', 'iso-b')")) == 2


def test_stream_replay_is_the_full_event_sequence(server: Server) -> None:
    key = uuid.uuid4().hex
    body = {
        "model": server.model,
        "prompt": "stream",
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
    }

    def events() -> tuple[list[str], httpx.Headers]:
        with (
            httpx.Client(base_url=server.url, timeout=60) as c,
            c.stream(
                "POST",
                "/v1/completions",
                json=body,
                headers=server.headers("alice", **{"Idempotency-Key": key}),
            ) as resp,
        ):
            return [line for line in resp.iter_lines() if line], resp.headers

    first, _ = events()
    second, headers = events()
    assert first[-1] == "data: [DONE]" and json.loads(first[-2][6:])["usage"]["completion_tokens"] == 4
    assert second == first
    assert headers["idempotent-replayed"] == "true"


def test_retry_while_running_attaches_to_the_same_engine_request(server: Server) -> None:
    key = uuid.uuid4().hex
    body = {"model": server.model, "prompt": "attach", "max_tokens": 60, "ignore_eos": True, "stream": True}
    outs: dict[str, list[str]] = {}

    def stream(name: str, request_id: str) -> None:
        with (
            httpx.Client(base_url=server.url, timeout=60) as c,
            c.stream(
                "POST",
                "/v1/completions",
                json=body,
                headers=server.headers(
                    "alice",
                    **{"Idempotency-Key": key, "X-Request-Id": request_id, "X-Task-Id": "attach-task"},
                ),
            ) as resp,
        ):
            outs[name] = [line for line in resp.iter_lines() if line]

    owner = threading.Thread(target=stream, args=("owner", "attach-owner"))
    owner.start()
    eid = server.engine_id("alice", "attach-owner")
    wait_for(lambda: server.state.engine.live_request(eid) is not None, 20, "owner running")
    retry = threading.Thread(target=stream, args=("retry", "attach-retry"))
    retry.start()
    owner.join(60)
    retry.join(60)
    assert outs["owner"] == outs["retry"]
    assert outs["owner"][-1] == "data: [DONE]"
    rows = server.usage_rows("task_id = 'attach-task'")
    assert [r["request_id"] for r in rows] == ["attach-owner"]
    assert rows[0]["completion_tokens"] == 60


def test_rejected_request_frees_its_key(server: Server) -> None:
    key = uuid.uuid4().hex
    body = {"model": server.model, "prompt": "x", "max_tokens": 40}
    late = _post(server, "alice", key, body, **{"X-Timeout-Ms": "1"})
    assert late.status_code == 400 and late.json()["error"]["code"] == "deadline_unmeetable"
    # The rejection stored nothing: the same key and body now run for real.
    fresh = _post(server, "alice", key, body, **{"X-Request-Id": "after-reject"})
    assert fresh.status_code == 200 and "idempotent-replayed" not in fresh.headers
    assert len(server.usage_rows("request_id = 'after-reject'")) == 1


def test_request_refused_for_a_reused_id_frees_its_key(server: Server) -> None:
    used = f"used-{uuid.uuid4().hex}"
    body = {"model": server.model, "prompt": "x", "max_tokens": 2}
    first = _post(server, "alice", uuid.uuid4().hex, body, **{"X-Request-Id": used})
    assert first.status_code == 200, first.text
    key = uuid.uuid4().hex
    reused = _post(server, "alice", key, body, **{"X-Request-Id": used})
    assert reused.status_code == 409 and reused.json()["error"]["code"] == "duplicate_request_id"
    # The 409 was raised inside the key's claim: leaving it let the key go, so the same key now runs.
    fresh = _post(server, "alice", key, body, **{"X-Request-Id": f"fresh-{uuid.uuid4().hex}"})
    assert fresh.status_code == 200 and "idempotent-replayed" not in fresh.headers
