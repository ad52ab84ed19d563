"""A keyed run outlives its last reader for the orphan grace, then is aborted: bounded work for a client that never retries."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from engine import AsyncEngine
from gateway.settings import GatewaySettings
from tests.gateway.conftest import Server, start_server, wait_for


@pytest.fixture()
def graced(server: Server) -> Iterator[Server]:
    """A second gateway on the same engine and database whose keyed runs outlive their readers by 3 s."""
    engine = server.state.engine
    assert isinstance(engine, AsyncEngine)  # the suite's in-process engine, whose config this gateway shares
    settings = GatewaySettings(
        data_dir=server.state.settings.data_dir, port=0, engine=engine.config, idempotent_orphan_grace_s=3.0
    )
    srv = start_server(settings, engine)
    srv.keys, srv.tenants = server.keys, server.tenants
    yield srv
    srv.stop()


def test_a_keyed_run_keeps_generating_through_the_grace_then_is_aborted(
    server: Server, graced: Server
) -> None:
    engine = server.state.engine
    body = {
        "model": server.model,
        "prompt": "orphan",
        "max_tokens": 2000,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = graced.headers("alice", **{"Idempotency-Key": "orphan-1", "X-Request-Id": "orphan-1"})
    seen = 0
    with (
        httpx.Client(base_url=graced.url, timeout=60) as c,
        c.stream("POST", "/v1/completions", json=body, headers=headers) as resp,
    ):
        assert resp.status_code == 200
        run = graced.state.runs.by_id[(graced.tenants["alice"].id, "orphan-1")]
        engine_id = run.spec.engine_id
        for line in resp.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["text"]:
                seen += 1
                break
    # The gateway saw the reader leave, and the run goes on: it waits for a retry that never comes.
    wait_for(lambda: run.readers == 0, 10, "the disconnect noticed")
    assert run.cancelled_by is None and engine.live_request(engine_id) is not None
    wait_for(lambda: engine.live_request(engine_id) is None, 30, "aborted once the grace is over")
    row = wait_for(lambda: graced.usage_rows("request_id = 'orphan-1'"), 10, "ledger row")[0]
    assert row["status"] == "cancelled" and seen < row["completion_tokens"] < 2000
    # Aborted for good, the record was abandoned: the key is free again (no replay of a cancelled run, no 422).
    again = httpx.post(
        graced.url + "/v1/completions",
        timeout=60,
        json={**body, "stream": False, "max_tokens": 2},
        headers=graced.headers("alice", **{"Idempotency-Key": "orphan-1"}),
    )
    assert again.status_code == 200 and "idempotent-replayed" not in again.headers
