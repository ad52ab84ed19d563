"""A gateway in front of an EngineRouter of two real engines: HTTP requests spread, /admin/api/engines and
/metrics show each engine's load and routed requests, a dead engine is routed around, none alive is a 503."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from engine import AsyncEngine, LLMEngine
from engine.worker.loader import load_model
from gateway.settings import GatewaySettings
from routing import EngineRouter
from tests.gateway.conftest import Server, engine_config, start_server, wait_for


@pytest.fixture(scope="module")
def routed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, dict[str, AsyncEngine]]]:
    """A gateway whose engine is a router over e0 and e1 (in-process engines on the embedded model)."""
    cfg = engine_config(tmp_path_factory.mktemp("routed-models"))
    loaded = load_model(None, dtype="auto", device="cpu")
    engines = {key: AsyncEngine(cfg, engine=LLMEngine(cfg, loaded=loaded)) for key in ("e0", "e1")}
    router = EngineRouter(engines)
    router.start()
    settings = GatewaySettings(data_dir=tmp_path_factory.mktemp("routed-data"), port=0, engine=cfg)
    server = start_server(settings, router)
    server.add_tenant("alice")
    server.add_tenant("bob")
    yield server, engines
    server.stop()
    router.shutdown()


def _complete(server: Server, tenant: str, prompt: str, max_tokens: int = 24) -> httpx.Response:
    body = {"model": server.model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
    return httpx.post(f"{server.url}/v1/completions", json=body, headers=server.headers(tenant), timeout=60)


def _admin(server: Server, path: str) -> Any:
    resp = httpx.get(
        f"{server.url}{path}", headers={"Authorization": f"Bearer {server.state.admin_token}"}, timeout=30
    )
    assert resp.status_code == 200, resp.text
    return resp.json() if path.startswith("/admin") else resp.text


def test_requests_spread_and_each_engine_shows_its_load_and_routed_count(
    routed: tuple[Server, dict[str, AsyncEngine]],
) -> None:
    server, _ = routed
    statuses: list[int] = []
    threads = [
        threading.Thread(
            target=lambda i=i: statuses.append(
                _complete(server, ("alice", "bob")[i % 2], f"request {i}").status_code
            )
        )
        for i in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert statuses == [200] * 8
    rows = {row["key"]: row for row in _admin(server, "/admin/api/engines")["engines"]}
    assert sorted(rows) == ["e0", "e1"]
    assert sum(row["routed"] for row in rows.values()) == 8 and all(
        row["routed"] > 0 for row in rows.values()
    )
    assert all(
        row["alive"] and row["in_flight"] == 0 and row["kv_blocks_total"] == 256 for row in rows.values()
    )
    metrics = _admin(server, "/metrics")
    for key, row in rows.items():
        assert f'fairserve_engine_routed_total{{engine="{key}"}} {float(row["routed"])}' in metrics
        assert f'fairserve_engine_up{{engine="{key}"}} 1.0' in metrics
    assert "fairserve_engine_kv_use{" in metrics and "fairserve_engine_waiting{" in metrics
    live = _admin(server, "/admin/api/live?history=0")
    assert [row["key"] for row in live["engines"]] == ["e0", "e1"]


def test_a_dead_engine_is_routed_around_and_none_alive_is_a_retryable_503(
    routed: tuple[Server, dict[str, AsyncEngine]],
) -> None:
    server, engines = routed
    engines["e0"].shutdown()
    before = {row["key"]: row["routed"] for row in _admin(server, "/admin/api/engines")["engines"]}
    assert [_complete(server, "alice", f"after {i}", 4).status_code for i in range(3)] == [200] * 3
    rows = {row["key"]: row for row in _admin(server, "/admin/api/engines")["engines"]}
    assert rows["e0"]["routed"] == before["e0"] and rows["e1"]["routed"] == before["e1"] + 3
    assert not rows["e0"]["alive"] and 'fairserve_engine_up{engine="e0"} 0.0' in _admin(server, "/metrics")
    engines["e1"].shutdown()
    wait_for(lambda: not server.state.engine.is_alive, 10, "the router to see no engine alive")
    resp = _complete(server, "bob", "nobody home", 4)
    assert resp.status_code == 503 and resp.json()["error"]["code"] == "engine_unavailable"
    assert int(resp.headers["Retry-After"]) >= 1
