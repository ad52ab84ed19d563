"""A gateway app given a router over attached engines, as each `fairserve ray up` gateway is built
(cluster/gateway_actor.py: no `--engine` in its settings, the engines arrive as RemoteEngines in an
EngineRouter): when its only engine falls silent past the heartbeat timeout (SIGSTOP here; a process starved
of CPU on a loaded machine looks the same), the requests in flight there fail retryably, and once the engine
is heard again the gateway answers again. Nothing supervises such an engine in the gateway, so a failure
must not leave it refusing for good."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import httpx

from engine.remote.client import RemoteEngine
from gateway.settings import GatewaySettings
from routing import EngineRouter
from tests.engine.remote.engine_process import EngineProcess
from tests.gateway.conftest import start_server, wait_for

ENGINE_ARGS = ("--num-kv-blocks", "512", "--max-num-batched-tokens", "64")


def test_a_router_of_attached_engines_serves_again_after_its_only_engine_was_silent(
    tmp_path: Path,
) -> None:
    engine = EngineProcess(tmp_path / "engine", *ENGINE_ARGS)
    remote = RemoteEngine(engine.address, heartbeat_timeout_s=0.5)
    stopped = False
    try:
        remote.start()
        router = EngineRouter({f"fairserve-engine-0@{engine.engine_id}": remote})
        server = start_server(GatewaySettings(data_dir=tmp_path / "gateway", port=0), router)
        try:
            server.add_tenant("alice")
            body = {"model": server.model, "prompt": "count", "max_tokens": 2000, "ignore_eos": True}
            with httpx.Client(base_url=server.url, timeout=60, headers=server.headers("alice")) as client:
                held: list[httpx.Response] = []
                plain = threading.Thread(
                    target=lambda: held.append(
                        client.post("/v1/completions", json=body, headers={"X-Request-Id": "in-flight"})
                    )
                )
                plain.start()
                server.engine_id("alice", "in-flight")  # live on the engine
                os.kill(engine.proc.pid, signal.SIGSTOP)
                stopped = True
                plain.join(60)
                assert held and held[0].status_code == 503, held
                assert "engine_unavailable" in held[0].text and "retry-after" in held[0].headers
                os.kill(engine.proc.pid, signal.SIGCONT)
                stopped = False
                short = {**body, "max_tokens": 4}
                wait_for(
                    lambda: client.post("/v1/completions", json=short).status_code == 200,
                    60,
                    "an answer once the engine is heard again",
                )
                assert client.get("/readyz").status_code == 200
        finally:
            server.stop()
    finally:
        if stopped:
            os.kill(engine.proc.pid, signal.SIGCONT)
        remote.shutdown(timeout_s=1.0)
        engine.stop()
