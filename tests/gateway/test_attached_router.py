"""A gateway app given a router over attached engines, as each `fairserve ray up` gateway is built
(cluster/gateway_actor.py: no `--engine` in its settings, the engines arrive as RemoteEngines in an
EngineRouter). An engine silent past the heartbeat bound (SIGSTOP here; a process starved of CPU on a
loaded machine looks the same) is only suspect: its requests in flight finish, a lone suspect engine
still takes new ones, and a router with another engine sends new ones there. Silent past the lost bound,
its requests in flight fail retryably, and once the engine is heard again the gateway answers again.
Nothing supervises such an engine in the gateway, so a failure must not leave it refusing for good."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from engine import RequestMeta, SamplingParams
from engine.serving.remote.client import RemoteEngine
from engine.serving.remote.liveness import SilenceBounds
from gateway.settings import GatewaySettings
from routing import EngineRouter
from tests.defaults import HEARTBEAT_TIMEOUT_S
from tests.engine.serving.remote.engine_process import EngineProcess
from tests.gateway.conftest import Server, start_server, wait_for

ENGINE_ARGS = ("--num-kv-blocks", "512", "--max-num-batched-tokens", "64")
NO_LOSS = 600.0  # a lost bound no test waits out: only suspicion can happen within it


@contextmanager
def frozen(engine: EngineProcess) -> Iterator[None]:
    """SIGSTOP the engine for the block, SIGCONT after it whatever happens."""
    os.kill(engine.proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(engine.proc.pid, signal.SIGCONT)


@contextmanager
def attached(tmp_path: Path, lost_timeout_s: float) -> Iterator[tuple[EngineProcess, RemoteEngine, Server]]:
    """An engine process, its RemoteEngine in a router, and a gateway app serving that router."""
    engine = EngineProcess(tmp_path / "engine", *ENGINE_ARGS)
    remote = RemoteEngine(engine.address, SilenceBounds(HEARTBEAT_TIMEOUT_S, lost_timeout_s))
    try:
        remote.start()
        router = EngineRouter({f"fairserve-engine-0@{engine.engine_id}": remote})
        server = start_server(GatewaySettings(data_dir=tmp_path / "gateway", port=0), router)
        try:
            server.add_tenant("alice")
            yield engine, remote, server
        finally:
            server.stop()
    finally:
        os.kill(engine.proc.pid, signal.SIGCONT)
        remote.shutdown(timeout_s=1.0)
        engine.stop()


def in_background(
    client: httpx.Client, body: dict[str, Any], request_id: str
) -> tuple[threading.Thread, list[httpx.Response]]:
    """POST a completion on a thread; the response lands in the returned list."""
    answer: list[httpx.Response] = []
    thread = threading.Thread(
        target=lambda: answer.append(
            client.post("/v1/completions", json=body, headers={"X-Request-Id": request_id})
        )
    )
    thread.start()
    return thread, answer


def test_a_pause_shorter_than_the_lost_bound_fails_nothing(tmp_path: Path) -> None:
    with attached(tmp_path, NO_LOSS) as (engine, remote, server):
        body = {"model": server.model, "prompt": "count", "max_tokens": 300, "ignore_eos": True}
        with httpx.Client(base_url=server.url, timeout=120, headers=server.headers("alice")) as client:
            held, answer = in_background(client, body, "in-flight")
            server.engine_id("alice", "in-flight")  # live on the engine
            with frozen(engine):
                wait_for(lambda: remote.is_suspect, 60, "the frozen engine to be suspect")
                ready = client.get("/readyz")
                assert ready.status_code == 200 and ready.json()["suspect_engines"], ready.text
                # A lone suspect engine still takes new requests: they run once it speaks again.
                late, late_answer = in_background(client, {**body, "max_tokens": 4}, "while-suspect")
                server.engine_id("alice", "while-suspect")
            held.join(120)
            late.join(120)
            assert answer and answer[0].status_code == 200, answer
            assert answer[0].json()["usage"]["completion_tokens"] == 300
            assert late_answer and late_answer[0].status_code == 200, late_answer
            assert remote.is_alive and not remote.is_suspect
            assert client.get("/readyz").json()["suspect_engines"] == []


def test_silence_past_the_lost_bound_fails_in_flight_and_the_engine_serves_again(tmp_path: Path) -> None:
    with attached(tmp_path, 1.5) as (engine, _, server):
        body = {"model": server.model, "prompt": "count", "max_tokens": 2000, "ignore_eos": True}
        with httpx.Client(base_url=server.url, timeout=60, headers=server.headers("alice")) as client:
            held, answer = in_background(client, body, "in-flight")
            server.engine_id("alice", "in-flight")  # live on the engine
            with frozen(engine):
                held.join(60)
                assert answer and answer[0].status_code == 503, answer
                assert "engine_unavailable" in answer[0].text and "retry-after" in answer[0].headers
            short = {**body, "max_tokens": 4}
            wait_for(
                lambda: client.post("/v1/completions", json=short).status_code == 200,
                60,
                "an answer once the engine is heard again",
            )
            assert client.get("/readyz").status_code == 200


def test_a_router_sends_new_requests_past_a_suspect_engine(tmp_path: Path) -> None:
    engines = [EngineProcess(tmp_path / f"engine-{i}", *ENGINE_ARGS) for i in range(2)]
    remotes = [RemoteEngine(e.address, SilenceBounds(HEARTBEAT_TIMEOUT_S, NO_LOSS)) for e in engines]

    async def scenario() -> list[str | None]:
        for remote in remotes:
            remote.start()
        router = EngineRouter({f"e{i}": r for i, r in enumerate(remotes)})
        router.bind(asyncio.get_running_loop())
        params = SamplingParams(max_tokens=2, temperature=0.0)
        with frozen(engines[0]):
            while not remotes[0].is_suspect:
                await asyncio.sleep(0.02)  # polling the condition, bounded by the test's timeout
            streams = [
                router.submit([1, 2, 3], params, RequestMeta(tenant_id="t"), f"r{i}") for i in range(4)
            ]
            chosen = [router.engine_of(f"r{i}") for i in range(4)]
            for stream in streams:
                async for _ in stream:
                    pass
        return chosen

    try:
        chosen = asyncio.run(asyncio.wait_for(scenario(), 60))
        assert chosen == ["e1"] * 4
    finally:
        for remote in remotes:
            remote.shutdown(timeout_s=1.0)
        for engine in engines:
            engine.stop()
