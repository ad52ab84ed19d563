"""The gateway actor: the gateway app under uvicorn, in front of a router the registry keeps current.

Actors running uvicorn rather than Ray Serve deployments: Serve would put its own HTTP proxy in front of
every request (one more hop and one more process on the request's path), and the gateway already is an
HTTP server with its own admission, streaming and drain. See docs/deploy.md for what was measured.

uvicorn runs on a thread of the actor with an event loop of its own; the router's RemoteEngines read on
that loop, and the registry sync (cluster/membership.py) runs there as a task.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar, cast

import ray
import uvicorn

from cluster.membership import Membership, join, member_key
from cluster.registry import REGISTRY_NAME, EngineEntry, GatewayEntry
from engine.serving.remote.client import RemoteEngine
from gateway.app import create_app
from gateway.settings import GatewaySettings
from routing.router import EngineRouter

STARTUP_TIMEOUT_S = 300.0


_R = TypeVar("_R")


class GatewayActor:
    """One gateway replica; its `url()` answers once uvicorn listens."""

    def __init__(
        self, name: str, settings: GatewaySettings, secrets: dict[str, str], poll_interval_s: float
    ) -> None:
        self.name = name
        silence = settings.engine_silence()
        self.settings = settings
        install_secrets(settings.data_dir, secrets)  # the cluster key among them (cluster/commands.py)
        key = settings.cluster_key()
        self._registry = ray.get_actor(REGISTRY_NAME)
        first = self._first_engine()
        self.router = EngineRouter({member_key(first): join(first, silence, key)}, settings.routing)
        self.membership = Membership(
            self.router, self._registry.engines.remote, poll_interval_s, silence, key
        )
        self.app = create_app(settings, engine=self.router)
        config = uvicorn.Config(
            self.app,
            host=settings.host,
            port=settings.port,
            log_level="warning",
            lifespan="on",
            timeout_graceful_shutdown=int(settings.grace_period_s) + 1,
        )
        self.server = uvicorn.Server(config)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name="gateway-uvicorn", daemon=True)
        self._thread.start()
        self._url = self._wait_listening()
        node_ip = ray.util.get_node_ip_address()
        ray.get(self._registry.register_gateway.remote(GatewayEntry(name, self._url, node_ip, os.getpid())))

    def _first_engine(self) -> EngineEntry:
        """A registered engine to build the router on (it names the model and brings the tokenizer)."""
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            registered: list[EngineEntry] = ray.get(self._registry.engines.remote())
            entries = [e for e in registered if not e.draining]
            if entries:
                return entries[0]
            time.sleep(0.2)  # polling the registry for a condition, bounded by the deadline
        raise TimeoutError(f"no engine registered within {STARTUP_TIMEOUT_S:.0f}s")

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        sync = self.loop.create_task(self._sync_after_startup())
        try:
            self.loop.run_until_complete(self.server.serve())
        finally:
            sync.cancel()
            self.router.shutdown(timeout_s=2.0)

    async def _sync_after_startup(self) -> None:
        loop = asyncio.get_running_loop()
        started = self.router.keys()
        for key in started:
            client = self.router.remove_engine(key)
            if client is not None:  # started before the loop existed: read it here from now on
                cast(RemoteEngine, client).bind(loop)  # every engine of a deployment is remote
                self.router.add_engine(key, client)
        await self.membership.run()

    def _wait_listening(self) -> str:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"gateway {self.name} did not start listening")
            time.sleep(0.05)  # waiting on uvicorn's started flag, bounded by the deadline
        host, port = self.server.servers[0].sockets[0].getsockname()[:2]
        if host in ("0.0.0.0", "::"):
            host = ray.util.get_node_ip_address()
        return f"http://{host}:{port}"

    def url(self) -> str:
        """Where this replica answers."""
        return self._url

    def pid(self) -> int:
        """Its process id (for the tests' kill drills)."""
        return os.getpid()

    def holds(self, actor_name: str) -> bool:
        """Whether an engine of `actor_name` is still in rotation here or has requests live here. A loop too
        busy to tell in time is busy, not empty: True (scale-down then asks again, bounded by its drain
        timeout), as deploy._holds takes a gateway slow to answer."""
        try:
            return self._on_loop(self.membership.holds, actor_name)
        except TimeoutError:
            return True

    def sync_rounds(self) -> int:
        """Registry syncs done so far."""
        return self.membership.rounds

    def engine_loads(self) -> list[dict[str, Any]]:
        """Each engine's health and load as this replica sees it (for `ray status`)."""
        return [asdict(load) for load in self._on_loop(self.router.engine_loads)]

    def stop(self) -> None:
        """Drain and stop uvicorn (the app's lifespan finishes in-flight requests, then the router stops)."""
        self.server.should_exit = True
        self._thread.join(self.settings.grace_period_s + 15)

    def _on_loop(self, fn: Callable[..., _R], *args: Any) -> _R:
        async def call() -> _R:
            return fn(*args)

        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(timeout=10)


def install_secrets(data_dir: Path, secrets: dict[str, str]) -> None:
    """Write the deployment's tokens into this node's data dir (0600), so every replica checks the same ones."""
    data_dir.mkdir(parents=True, exist_ok=True)
    for filename, text in secrets.items():
        path = data_dir / filename
        if path.exists() and path.read_text().strip() == text:
            continue
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text + "\n")
