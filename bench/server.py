"""A gateway the bench starts itself: uvicorn on an ephemeral 127.0.0.1 port, on a thread, temp data dir."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import uvicorn

from engine import AsyncEngine, EngineConfig, ProcessEngine
from gateway.app import create_app
from gateway.settings import GatewaySettings
from gateway.state import GatewayState


def free_port() -> int:
    """A loopback port nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
) -> LocalServer:
    """Start a gateway on `config` (or on `engine`), then create each (tenant, weight) with a key."""
    if engine is None:
        engine = AsyncEngine(config)
        engine.start()
    settings = GatewaySettings(
        data_dir=data_dir, port=0, engine=engine.config, grace_period_s=2.0, max_queued_requests=256
    )
    app = create_app(settings, engine)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=5)
    )
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    deadline = time.monotonic() + 120.0
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            engine.shutdown()
            raise RuntimeError("the bench's gateway did not start")
        time.sleep(0.02)
    state: GatewayState = app.state.gateway
    local = LocalServer(f"http://127.0.0.1:{sock.getsockname()[1]}", engine, server, thread, state)
    for name, weight in tenants:
        tenant = state.store.get_tenant(name) or state.store.create_tenant(name, weight=weight)
        local.keys[name], _ = state.store.create_key(tenant.id, name="bench")
    return local
