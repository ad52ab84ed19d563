"""A gateway the bench starts itself: uvicorn on an ephemeral 127.0.0.1 port, on a thread, temp data dir."""

from __future__ import annotations

import asyncio
import socket
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from starlette.types import ASGIApp

from engine import AsyncEngine, EngineConfig, ProcessEngine
from gateway.app import create_app
from gateway.settings import GatewaySettings
from gateway.state import GatewayState


def free_port() -> int:
    """A loopback port nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_on_thread(app: ASGIApp, timeout_s: float) -> tuple[str, uvicorn.Server, threading.Thread]:
    """Run `app` under uvicorn on a daemon thread on a free port; its URL once it serves."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=5)
    )
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the bench's gateway did not start")
        time.sleep(0.02)
    return f"http://127.0.0.1:{sock.getsockname()[1]}", server, thread


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

    def admin(self) -> dict[str, str]:
        """Authorization for the admin API."""
        return {"Authorization": f"Bearer {self.state.admin_token}"}

    async def complete(
        self, client: httpx.AsyncClient, tenant: str, headers: dict[str, str] | None = None, **body: Any
    ) -> httpx.Response:
        """POST /v1/completions as `tenant` to the served model."""
        auth = {"Authorization": f"Bearer {self.keys[tenant]}", **(headers or {})}
        return await client.post("/v1/completions", json={"model": self.model, **body}, headers=auth)

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
    try:
        url, server, thread = serve_on_thread(app, 120.0)
    except RuntimeError:
        engine.shutdown()
        raise
    state: GatewayState = app.state.gateway
    local = LocalServer(url, engine, server, thread, state)
    for name, weight in tenants:
        tenant = state.store.get_tenant(name) or state.store.create_tenant(name, weight=weight)
        local.keys[name], _ = state.store.create_key(tenant.id, name="bench")
    return local


@contextmanager
def local_gateway(tenants: Iterable[str], **engine: Any) -> Iterator[LocalServer]:
    """A gateway over a fresh engine (`engine`: EngineConfig fields) in a temp dir; tenants of weight 1."""
    with tempfile.TemporaryDirectory() as tmp:
        config = EngineConfig(cache_dir=str(Path(tmp) / "model"), **engine)
        server = start_local_server(config, Path(tmp), [(t, 1.0) for t in tenants])
        try:
            yield server
        finally:
            server.stop()
