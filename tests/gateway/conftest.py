"""One real gateway (uvicorn on an ephemeral port, real engine, real SQLite) shared by the suite."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from sqlalchemy import text

from billing import BillingStore, Tenant
from engine import AsyncEngine, EngineClient, EngineConfig
from gateway.app import create_app
from gateway.edge.connections import server_config
from gateway.settings import GatewaySettings
from gateway.state import GatewayState

REDIS_URL = "redis://127.0.0.1:6379/15"


def wait_for(condition: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    """Poll `condition` until truthy, failing after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def engine_config(cache_dir: Path) -> EngineConfig:
    """A small engine: few sequences and KV blocks so saturation is cheap to reach. Its charge is the token
    formula alone (`step_cost_charge=False`), which the ledger tests check figure for figure; the step's
    budget keeps the device's step cost model (engine/core/step_cost.py, tests/engine/core/test_step_cost.py)."""
    return EngineConfig(
        max_num_seqs=8,
        num_kv_blocks=256,
        max_num_batched_tokens=256,
        cache_dir=str(cache_dir),
        step_cost_charge=False,
    )


@dataclass
class Server:
    """A running gateway: its URL, app state and the thread serving it."""

    url: str
    app: Any
    server: uvicorn.Server
    thread: threading.Thread
    keys: dict[str, str] = field(default_factory=dict)
    tenants: dict[str, Tenant] = field(default_factory=dict)

    @property
    def state(self) -> GatewayState:
        """The app's GatewayState."""
        return self.app.state.gateway  # type: ignore[no-any-return]

    @property
    def model(self) -> str:
        """The served model's name."""
        return self.state.engine.model_name

    def headers(self, tenant: str, **extra: str) -> dict[str, str]:
        """Authorization for a tenant plus extra headers."""
        return {"Authorization": f"Bearer {self.keys[tenant]}", **extra}

    def add_tenant(self, name: str, **fields: Any) -> None:
        """Create a tenant with one key."""
        store: BillingStore = self.state.store
        tenant = store.create_tenant(name, **fields)
        secret, _ = store.create_key(tenant.id)
        self.tenants[name] = tenant
        self.keys[name] = secret

    def engine_id(self, tenant: str, request_id: str, timeout: float = 20.0) -> str:
        """The engine's id of a tenant's live request: the gateway's own, never the caller's X-Request-Id."""
        key = (self.tenants[tenant].id, request_id)
        run = wait_for(lambda: self.state.runs.by_id.get(key), timeout, f"run {request_id} live")
        return str(run.spec.engine_id)

    def usage_rows(self, where: str, **params: Any) -> list[Any]:
        """Ledger rows (flushed first) matching a SQL condition."""
        assert self.state.ledger.flush(10.0)
        with self.state.db.engine.connect() as conn:
            return list(conn.execute(text(f"SELECT * FROM usage WHERE {where}"), params).mappings())

    def stop(self) -> None:
        """Shut the server down and wait for its thread."""
        self.server.should_exit = True
        self.thread.join(30)


def start_server(settings: GatewaySettings, engine: EngineClient | None) -> Server:
    """Run create_app(settings, engine) under uvicorn on an ephemeral 127.0.0.1 port in a thread."""
    app = create_app(settings, engine)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = server_config(app, settings, log_level="warning", lifespan="on", timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    wait_for(lambda: server.started, 60, "uvicorn startup")
    return Server(f"http://127.0.0.1:{port}", app, server, thread)


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's data directory (SQLite database, secrets)."""
    return tmp_path_factory.mktemp("gateway-data")


@pytest.fixture(scope="session")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AsyncEngine]:
    """One real engine with the embedded model, shared by the suite."""
    eng = AsyncEngine(engine_config(tmp_path_factory.mktemp("models")))
    eng.start()
    yield eng
    eng.shutdown()


@pytest.fixture(scope="session")
def server(engine: AsyncEngine, data_dir: Path) -> Iterator[Server]:
    """The shared gateway, with tenants alice, bob, a small-quota tenant and a one-request queue tenant."""
    # Many tests send deliberate bad requests as alice, so the shared server's refusal budget is wide;
    # the budget itself is tested on gateways of its own (tests/gateway/openai/test_refusal_budget.py).
    settings = GatewaySettings(
        data_dir=data_dir, port=0, engine=engine.config, key_cache_ttl_s=0.5, refusal_burst=100_000
    )
    srv = start_server(settings, engine)
    srv.add_tenant("alice")
    srv.add_tenant("bob")
    srv.add_tenant("metered", tokens_per_minute=100)
    srv.add_tenant("narrow", max_queued_requests=1)
    srv.add_tenant("hog", weight=1.0)
    yield srv
    srv.stop()


@pytest.fixture()
def client(server: Server) -> Iterator[httpx.Client]:
    """An HTTP client for the shared server."""
    with httpx.Client(base_url=server.url, timeout=60.0) as c:
        yield c


def redis_available() -> bool:
    """True when Redis answers on 127.0.0.1:6379."""
    import redis

    try:
        return bool(redis.Redis.from_url(REDIS_URL, socket_timeout=1).ping())
    except Exception:
        return False


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The test Redis URL; fails under CI=true when Redis is down, else skips."""
    if not redis_available():
        if os.environ.get("CI") == "true":
            pytest.fail("Redis at 127.0.0.1:6379 is required under CI=true")
        pytest.skip("Redis at 127.0.0.1:6379 is not reachable")
    return REDIS_URL


class Hogs:
    """N long streaming requests that fill every engine sequence slot until cancelled by task id."""

    def __init__(
        self,
        server: Server,
        tenant: str = "hog",
        n: int = 8,
        task_id: str = "hog-task",
        max_tokens: int = 400,
    ) -> None:
        self.server = server
        self.tenant = tenant
        self.n = n
        self.task_id = task_id
        self.max_tokens = max_tokens
        self.threads: list[threading.Thread] = []
        self.finish_reasons: list[str | None] = []

    def _one(self, i: int) -> None:
        body = {
            "model": self.server.model,
            "prompt": f"hog {i}",
            "max_tokens": self.max_tokens,
            "stream": True,
            "ignore_eos": True,
        }
        headers = self.server.headers(self.tenant, **{"X-Task-Id": self.task_id})
        with (
            httpx.Client(base_url=self.server.url, timeout=120) as c,
            c.stream("POST", "/v1/completions", json=body, headers=headers) as resp,
        ):
            last = None
            for line in resp.iter_lines():
                if line.startswith("data: {"):
                    last = json.loads(line[6:])["choices"][0]["finish_reason"]
            self.finish_reasons.append(last)

    def __enter__(self) -> Hogs:
        engine = self.server.state.engine
        for i in range(self.n):
            t = threading.Thread(target=self._one, args=(i,), daemon=True)
            t.start()
            self.threads.append(t)
        wait_for(
            lambda: engine.stats().running >= self.n and engine.stats().iteration_seconds > 0,
            30,
            "hogs to fill the batch",
        )
        return self

    def __exit__(self, *exc: object) -> None:
        with httpx.Client(base_url=self.server.url, timeout=30) as c:
            c.post(f"/v1/tasks/{self.task_id}/cancel", headers=self.server.headers(self.tenant))
        for t in self.threads:
            t.join(60)
        engine = self.server.state.engine
        wait_for(lambda: engine.stats().running == 0 and engine.stats().waiting == 0, 30, "engine to drain")


@pytest.fixture()
def gateway(server: Server) -> Iterator[Callable[..., Server]]:
    """Start gateways on the suite's engine and database with the given settings; stopped at the end."""
    started: list[Server] = []

    def start(**fields: Any) -> Server:
        engine = server.state.engine
        assert isinstance(engine, AsyncEngine)
        settings = GatewaySettings(
            data_dir=server.state.settings.data_dir, port=0, engine=engine.config, **fields
        )
        srv = start_server(settings, engine)
        srv.keys, srv.tenants = server.keys, server.tenants
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.stop()
