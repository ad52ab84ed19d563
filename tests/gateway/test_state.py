"""Engine failure: in-flight requests fail with 503 engine_unavailable, readiness drops, rows are recorded."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import httpx

from engine import AsyncEngine
from gateway.settings import GatewaySettings
from tests.gateway.conftest import engine_config, start_server, wait_for


def test_engine_death_fails_in_flight_requests_and_readiness(tmp_path: Path) -> None:
    engine = AsyncEngine(engine_config(tmp_path / "models"))
    engine.start()
    srv = start_server(GatewaySettings(data_dir=tmp_path, port=0, engine=engine.config), engine)
    try:
        srv.add_tenant("t")
        crash = threading.Event()
        real_step = engine.engine.step_deltas  # what the engine loop calls each iteration

        def step() -> Any:
            if crash.is_set():
                raise RuntimeError("injected accelerator fault")
            return real_step()

        engine.engine.step_deltas = step  # type: ignore[method-assign]
        results: dict[str, Any] = {}
        body = {"model": srv.model, "prompt": "doomed", "max_tokens": 500, "ignore_eos": True}

        def plain() -> None:
            with httpx.Client(base_url=srv.url, timeout=60) as c:
                results["plain"] = c.post(
                    "/v1/completions", json=body, headers=srv.headers("t", **{"X-Request-Id": "dead-1"})
                )

        def stream() -> None:
            with (
                httpx.Client(base_url=srv.url, timeout=60) as c,
                c.stream(
                    "POST",
                    "/v1/completions",
                    json={**body, "stream": True},
                    headers=srv.headers("t", **{"X-Request-Id": "dead-2"}),
                ) as resp,
            ):
                results["stream"] = [line for line in resp.iter_lines() if line]

        threads = [threading.Thread(target=plain), threading.Thread(target=stream)]
        for t in threads:
            t.start()
        eids = [srv.engine_id("t", "dead-1"), srv.engine_id("t", "dead-2")]
        wait_for(
            lambda: (
                engine.live_request(eids[0]) and engine.live_request(eids[1]) and engine.stats().running == 2
            ),
            20,
            "both running",
        )
        crash.set()
        for t in threads:
            t.join(10)
            assert not t.is_alive(), "a request was left hanging after the engine died"
        plain_resp = results["plain"]
        assert plain_resp.status_code == 503
        assert plain_resp.json()["error"]["code"] == "engine_unavailable"
        events = results["stream"]
        assert events[-1] == "data: [DONE]"
        assert json.loads(events[-2][6:])["error"]["code"] == "engine_unavailable"
        with httpx.Client(base_url=srv.url, timeout=10) as c:
            ready = c.get("/readyz")
            assert ready.status_code == 503 and ready.json()["checks"]["engine"] is False
            after = c.post("/v1/completions", json=body, headers=srv.headers("t"))
            assert after.status_code == 503 and after.json()["error"]["code"] == "engine_unavailable"
            assert "retry-after" in after.headers
        rows = srv.usage_rows("request_id IN ('dead-1', 'dead-2')")
        assert sorted((r["request_id"], r["status"]) for r in rows) == [
            ("dead-1", "error"),
            ("dead-2", "error"),
        ]
    finally:
        srv.stop()
        engine.shutdown()
