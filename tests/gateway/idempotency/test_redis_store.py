"""The Redis idempotency store, and idempotency shared by two gateway processes through it."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from engine import AsyncEngine
from gateway.idempotency.records import StoredResponse
from gateway.idempotency.redis_store import RedisIdempotencyStore, redis_key
from gateway.settings import GatewaySettings
from tests.defaults import REDIS_TIMEOUT_S
from tests.gateway.conftest import Server, start_server, wait_for
from tests.gateway.serve_process import ServeProcess


def test_redis_store_claim_attach_finish_follow(redis_url: str) -> None:
    key = uuid.uuid4().hex

    async def scenario() -> None:
        store = RedisIdempotencyStore(redis_url, ttl_s=2.0, timeout_s=REDIS_TIMEOUT_S)
        other = RedisIdempotencyStore(redis_url, ttl_s=2.0, timeout_s=REDIS_TIMEOUT_S)  # a second replica
        try:
            assert (await store.claim("t", key, "fp", "r1")).outcome == "new"
            assert (await other.claim("t", key, "fp", "r2")).outcome == "attach"
            assert (await other.claim("t", key, "zz", "r2")).outcome == "mismatch"
            assert (await other.claim("u", key, "fp", "r3")).outcome == "new"
            follower = other.follow("t", key, poll_s=0.005)
            await store.append("t", key, "one")
            first = await anext(follower)
            assert first.chunks == ["one"]
            await store.append("t", key, "two")
            assert (await anext(follower)).chunks == ["two"]
            final = StoredResponse(200, "sse", ["one", "two", "[DONE]"], {"X-Request-Id": "r1"})
            await store.finish("t", key, final)
            assert (await anext(follower)).final == final
            replay = await other.claim("t", key, "fp", "r4")
            assert replay.outcome == "replay" and replay.response == final
            ttl_ms = await store._redis.pttl(redis_key("t", key))
            assert ttl_ms != -1 and ttl_ms <= 2000  # it expires (-1: it would not), at most the TTL from now
            await store.abandon("t", key)
            assert (await other.claim("t", key, "fp", "r5")).outcome == "new"
        finally:
            await store.abandon("t", key)
            await store.abandon("u", key)
            await store.close()
            await other.close()

    asyncio.run(scenario())


def test_redis_record_expires_after_ttl(redis_url: str) -> None:
    key = uuid.uuid4().hex

    async def scenario() -> None:
        store = RedisIdempotencyStore(redis_url, ttl_s=0.2, timeout_s=REDIS_TIMEOUT_S)
        try:
            assert (await store.claim("t", key, "fp", "r1")).outcome == "new"
            await store.finish("t", key, StoredResponse(200, "json", ["{}"]))
            deadline = time.monotonic() + 5
            outcome = "replay"
            while outcome == "replay" and time.monotonic() < deadline:
                outcome = (await store.claim("t", key, "fp", "r2")).outcome
            assert outcome == "new"
        finally:
            await store.abandon("t", key)
            await store.close()

    asyncio.run(scenario())


@pytest.fixture(scope="module")
def replicas(server: Server, redis_url: str) -> Iterator[tuple[Server, ServeProcess]]:
    """Gateway A in this process and gateway B as a `fairserve serve` subprocess, sharing DB and Redis."""
    engine = server.state.engine
    assert isinstance(engine, AsyncEngine)  # the suite's in-process engine, whose config this gateway shares
    settings = GatewaySettings(
        data_dir=server.state.settings.data_dir,
        port=0,
        engine=engine.config,
        redis_url=redis_url,
        redis_timeout_s=2.0,
    )  # no breaker trip on a loaded machine
    a = start_server(settings, engine)
    a.keys, a.tenants = server.keys, server.tenants
    b = ServeProcess(
        server.state.settings.data_dir, "--redis", redis_url, "--redis-timeout", "2", "--max-num-seqs", "8"
    )
    try:
        yield a, b
    finally:
        b.stop()
        a.stop()


def _stream(
    url: str, headers: dict[str, str], body: dict[str, Any], out: dict[str, list[str]], name: str
) -> None:
    with (
        httpx.Client(base_url=url, timeout=60) as c,
        c.stream("POST", "/v1/completions", json=body, headers=headers) as resp,
    ):
        out[name] = [line for line in resp.iter_lines() if line]
        out[name + ".id"] = [resp.headers["x-request-id"]]


def test_two_processes_share_replay_and_attach(server: Server, replicas: tuple[Server, ServeProcess]) -> None:
    a, b = replicas
    key = uuid.uuid4().hex
    body = {"model": server.model, "prompt": "shared", "max_tokens": 40, "ignore_eos": True, "stream": True}
    headers = a.headers("alice", **{"Idempotency-Key": key, "X-Request-Id": "xproc-1", "X-Task-Id": "xproc"})
    out: dict[str, list[str]] = {}
    owner = threading.Thread(target=_stream, args=(a.url, headers, body, out, "a"))
    owner.start()
    eid = a.engine_id("alice", "xproc-1")
    wait_for(lambda: server.state.engine.live_request(eid) is not None, 20, "owner running on A")
    follower = threading.Thread(
        target=_stream, args=(b.url, {**headers, "X-Request-Id": "xproc-2"}, body, out, "b")
    )
    follower.start()
    owner.join(60)
    follower.join(60)
    assert out["a"][-1] == "data: [DONE]"
    assert out["b"] == out["a"]  # B attached through Redis and saw the same events
    assert out["b.id"] == ["xproc-1"]
    # After the owner finished, B replays from Redis; and the key of another tenant is a new request on B.
    with httpx.Client(base_url=b.url, timeout=60) as c:
        replay = c.post("/v1/completions", json=body, headers={**headers, "X-Request-Id": "xproc-3"})
        assert replay.headers["idempotent-replayed"] == "true"
        assert [line for line in replay.text.splitlines() if line] == out["a"]
        mismatch = c.post("/v1/completions", json={**body, "max_tokens": 41}, headers=headers)
        assert mismatch.status_code == 422
        bob = c.post(
            "/v1/completions",
            json={**body, "stream": False, "max_tokens": 2},
            headers=b.headers(server.keys["bob"], **{"Idempotency-Key": key}),
        )
        assert bob.status_code == 200 and "idempotent-replayed" not in bob.headers
    rows = a.usage_rows("task_id = 'xproc'")
    assert [r["request_id"] for r in rows] == ["xproc-1"]
    assert json.loads(out["a"][-2][6:])["choices"][0]["finish_reason"] == "length"
