"""A gateway the bench starts itself: uvicorn on an ephemeral 127.0.0.1 port, on a thread, temp data dir."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn

from billing import BillingStore
from engine import AsyncEngine, EngineConfig, ProcessEngine
from gateway.app import create_app
from gateway.settings import GatewaySettings
from gateway.state import GatewayState


@dataclass
class LocalServer:
    """A running gateway over an engine this process owns, with one API key per bench tenant."""

    url: str
    engine: AsyncEngine | ProcessEngine
    server: uvicorn.Server
    thread: threading.Thread
    state: GatewayState
    keys: dict[str, str] = field(default_factory=dict)

    @property
    def model(self) -> str:
        """The served model's name."""
        return self.engine.model_name

    def stop(self) -> None:
        """Stop uvicorn (which drains the gateway), then the engine."""
        self.server.should_exit = True
        self.thread.join(60)
        self.engine.shutdown()


def start_local_server(
    config: EngineConfig,
    data_dir: Path,
    tenants: Iterable[tuple[str, float]],
    engine: AsyncEngine | ProcessEngine | None = None,
    timeout_s: float = 120.0,
    max_queued_requests: int = 256,
) -> LocalServer:
    """Start a gateway on `config` (or on `engine`), then create each (tenant, weight) with a key."""
    if engine is None:
        engine = AsyncEngine(config)
        engine.start()
    settings = GatewaySettings(
        data_dir=data_dir,
        port=0,
        engine=engine.config,
        grace_period_s=2.0,
        max_queued_requests=max_queued_requests,
    )
    app = create_app(settings, engine)
    try:
        url, server, thread = _serve(app, timeout_s)
    except RuntimeError:
        engine.shutdown()
        raise
    state: GatewayState = app.state.gateway
    local = LocalServer(url, engine, server, thread, state)
    store: BillingStore = state.store
    for name, weight in tenants:
        tenant = store.get_tenant(name) or store.create_tenant(name, weight=weight)
        local.keys[name], _ = store.create_key(tenant.id, name="bench")
    return local


def _serve(app: Any, timeout_s: float) -> tuple[str, uvicorn.Server, threading.Thread]:
    """uvicorn for `app` on an ephemeral 127.0.0.1 port, on a thread, once it has started."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=5)
    )
    thread = threading.Thread(
        target=lambda: asyncio.run(server.serve(sockets=[sock])), name="bench-gateway", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the bench's gateway did not start")
        time.sleep(0.02)
    return f"http://127.0.0.1:{port}", server, thread


@dataclass
class ModelsServer:
    """A gateway serving several local models (one engine worker each) and one bench tenant's key."""

    url: str
    key: str
    server: uvicorn.Server
    thread: threading.Thread

    def stop(self) -> None:
        """Stop uvicorn; the gateway drains and stops the engines it started."""
        self.server.should_exit = True
        self.thread.join(60)


def start_models_server(
    models: list[Path], data_dir: Path, fallbacks: dict[str, str], timeout_s: float = 300.0
) -> ModelsServer:
    """`serve --model A --model B --fallback-model BIG=SMALL` in-process, with a `bench` tenant."""
    settings = GatewaySettings.load(
        {
            "data_dir": data_dir,
            "port": 0,
            "grace_period_s": 2.0,
            "refusal_burst": 1_000_000,  # infeasible deadlines are refused on purpose, by the hundred
            "models": {
                "local_models": [str(m) for m in models],
                "fallback_models": [f"{big}={small}" for big, small in fallbacks.items()],
            },
        }
    )
    app = create_app(settings, None)
    url, server, thread = _serve(app, timeout_s)
    store: BillingStore = app.state.gateway.store
    tenant = store.get_tenant("bench") or store.create_tenant("bench")
    key, _ = store.create_key(tenant.id, name="bench")
    return ModelsServer(url, key, server, thread)
