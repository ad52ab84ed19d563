"""The benchmark's minimal HTTP/1.1 client against a real `fairserve serve`: bodies, streams, keep-alive."""

from __future__ import annotations

import asyncio
import json

from experiments.http1 import Http1Pool
from tests.bench.conftest import LiveServer


def test_whole_and_chunked_responses_over_reused_connections(live_server: LiveServer) -> None:
    async def scenario() -> None:
        pool = Http1Pool(live_server.url, {"Authorization": f"Bearer {live_server.api_key}"})
        await pool.prewarm(2)
        models = await pool.request("GET", "/v1/models")
        model = models.json()["data"][0]["id"]
        body = {"model": model, "prompt": "hello", "max_tokens": 3, "ignore_eos": True}
        whole = await pool.request("POST", "/v1/completions", body)
        assert whole.status == 200 and whole.headers["x-request-id"]
        assert json.loads(whole.body)["usage"]["completion_tokens"] == 3
        stream = await pool.request("POST", "/v1/completions", {**body, "stream": True}, marker=b"data: {")
        events = [e for e in stream.body.decode().split("\n\n") if e]
        assert stream.headers["transfer-encoding"] == "chunked" and events[-1] == "data: [DONE]"
        assert stream.marked_at is not None
        refused = await pool.request("POST", "/v1/completions", {**body, "max_tokens": 0})
        assert refused.status == 400 and json.loads(refused.body)["error"]["param"] == "max_tokens"
        assert len(pool._idle) == 2  # every response left its connection reusable
        await pool.close()

    asyncio.run(scenario())
