"""Cancellation: by request id, by task id, by client disconnect; tenants only see their own work."""

from __future__ import annotations

import json
import socket
import threading
from typing import Any

import httpx

from tests.gateway.conftest import Server, wait_for


def _long(server: Server, **kw: object) -> dict[str, Any]:
    return {"model": server.model, "prompt": "a long one", "max_tokens": 300, "ignore_eos": True, **kw}


def _stream_in_thread(
    server: Server, tenant: str, headers: dict[str, str], out: list[str]
) -> threading.Thread:
    def run() -> None:
        with (
            httpx.Client(base_url=server.url, timeout=60) as c,
            c.stream(
                "POST",
                "/v1/completions",
                json=_long(server, stream=True),
                headers=server.headers(tenant, **headers),
            ) as resp,
        ):
            out.extend(line for line in resp.iter_lines() if line)

    t = threading.Thread(target=run)
    t.start()
    return t


def test_cancel_request_own_tenant_only(server: Server, client: httpx.Client) -> None:
    events: list[str] = []
    t = _stream_in_thread(server, "alice", {"X-Request-Id": "cancel-me"}, events)
    engine = server.state.engine
    eid = server.engine_id("alice", "cancel-me")
    assert eid != "cancel-me"  # the engine never sees the caller's string as its id
    wait_for(
        lambda: (info := engine.live_request(eid)) is not None and info.state == "running",
        20,
        "request running",
    )
    other = client.post("/v1/requests/cancel-me/cancel", headers=server.headers("bob"))
    assert other.status_code == 404 and other.json()["error"]["code"] == "request_not_found"
    assert engine.live_request(eid) is not None
    mine = client.post("/v1/requests/cancel-me/cancel", headers=server.headers("alice"))
    assert mine.status_code == 200 and mine.json()["cancelled"] is True
    t.join(30)
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2][6:])["choices"][0]["finish_reason"] == "cancelled"
    row = server.usage_rows("request_id = 'cancel-me'")[0]
    assert row["status"] == "cancelled" and row["cancel_state"] == "decode"
    assert row["completion_tokens"] < 300
    assert client.post("/v1/requests/cancel-me/cancel", headers=server.headers("alice")).status_code == 404


def test_cancel_task_cancels_every_request_of_the_task(server: Server, client: httpx.Client) -> None:
    outs: list[list[str]] = [[], []]
    threads = [
        _stream_in_thread(server, "alice", {"X-Task-Id": "task-77", "X-Request-Id": f"t77-{i}"}, outs[i])
        for i in range(2)
    ]
    engine = server.state.engine
    eids = [server.engine_id("alice", f"t77-{i}") for i in range(2)]
    wait_for(lambda: all(engine.live_request(e) for e in eids), 20, "both live")
    assert client.post("/v1/tasks/task-77/cancel", headers=server.headers("bob")).status_code == 404
    resp = client.post("/v1/tasks/task-77/cancel", headers=server.headers("alice"))
    assert resp.status_code == 200 and resp.json()["cancelled"] == ["t77-0", "t77-1"]
    for t in threads:
        t.join(30)
    rows = server.usage_rows("task_id = 'task-77'")
    assert sorted(r["status"] for r in rows) == ["cancelled", "cancelled"]
    assert all(r["cancel_state"] in ("waiting", "prefill", "decode") for r in rows)


def test_disconnect_mid_stream_frees_kv_blocks(server: Server) -> None:
    engine = server.state.engine
    wait_for(lambda: engine.stats().running == 0, 30, "idle engine")
    baseline = engine.stats().kv_blocks_used
    with (
        httpx.Client(base_url=server.url, timeout=60) as c,
        c.stream(
            "POST",
            "/v1/completions",
            json=_long(server, stream=True, prompt="disconnect " * 40),
            headers=server.headers("alice", **{"X-Request-Id": "gone-1"}),
        ) as resp,
    ):
        eid = server.engine_id("alice", "gone-1")
        lines = resp.iter_lines()
        for line in lines:
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["text"]:
                break
        assert engine.stats().kv_blocks_used > baseline
    # Leaving the block closed the connection mid-stream.
    wait_for(lambda: engine.live_request(eid) is None, 10, "engine request aborted")
    wait_for(lambda: engine.stats().kv_blocks_used <= baseline, 10, "KV blocks freed")
    row = wait_for(lambda: server.usage_rows("request_id = 'gone-1'"), 10, "ledger row")[0]
    assert row["status"] == "cancelled" and row["completion_tokens"] < 300


def test_disconnect_while_waiting_non_streaming_aborts(server: Server) -> None:
    """A non-streaming client that hangs up while its answer is being generated cancels it in the engine.

    The client closes its socket once the gateway holds the run (not after a read timeout, which a fast
    engine could beat), and asks for far more tokens than are made between those two moments.
    """
    engine = server.state.engine
    host, port = server.url.removeprefix("http://").split(":")
    body = json.dumps(_long(server, max_tokens=1500)).encode()
    head = {**server.headers("alice", **{"X-Request-Id": "nb-1"}), "Content-Type": "application/json"}
    request = (
        "POST /v1/completions HTTP/1.1\r\n"
        + f"Host: {host}\r\nContent-Length: {len(body)}\r\n"
        + "".join(f"{k}: {v}\r\n" for k, v in head.items())
        + "\r\n"
    ).encode() + body
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(request)
        eid = server.engine_id("alice", "nb-1")
    wait_for(lambda: engine.live_request(eid) is None, 10, "aborted after disconnect")
    row = wait_for(lambda: server.usage_rows("request_id = 'nb-1'"), 10, "ledger row")[0]
    assert row["status"] == "cancelled" and row["completion_tokens"] < 1500
