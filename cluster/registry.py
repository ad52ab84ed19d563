"""The registry actor: which engines and gateways exist, where they listen, and which engines are draining.

One named, detached actor per namespace. Engine actors register themselves (again after every restart,
and every few seconds so that a restarted registry learns them back); gateways read `engines()` to keep
their router's membership current. The registry pings every engine and drops one whose actor is dead or
silent past `ping_timeout_s`: gateways notice a dead engine sooner on their own (its heartbeat stops, see
engine.remote.client), so the ping only keeps the list honest for `ray status` and for newcomers.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, replace
from typing import Any

REGISTRY_NAME = "fairserve-registry"


@dataclass(frozen=True)
class EngineEntry:
    """One engine incarnation: `name` is its actor's (stable across restarts), `engine_id` its process's."""

    name: str
    address: str
    engine_id: str
    node_ip: str
    pid: int
    draining: bool = False


@dataclass(frozen=True)
class GatewayEntry:
    """One gateway replica and the URL it answers on."""

    name: str
    url: str
    node_ip: str
    pid: int


class Registry:
    """Engines and gateways by actor name (Ray runs it as an async actor: its methods share one loop)."""

    def __init__(self, ping_interval_s: float, ping_timeout_s: float) -> None:
        self.ping_interval_s = ping_interval_s
        self.ping_timeout_s = ping_timeout_s
        self._engines: dict[str, EngineEntry] = {}
        self._handles: dict[str, Any] = {}
        self._draining: set[str] = set()
        self._gateways: dict[str, GatewayEntry] = {}
        self._sweep: asyncio.Task[None] | None = None
        self._deployment: tuple[Any, dict[str, str], Any] | None = None

    async def keep_deployment(self, settings: Any, secrets: dict[str, str], cluster: Any) -> None:
        """The settings, tokens and cluster knobs `ray up` used: `ray scale` starts new actors with them."""
        self._deployment = (settings, secrets, cluster)

    async def deployment(self) -> tuple[Any, dict[str, str], Any] | None:
        """What `keep_deployment` kept (None before `ray up`)."""
        return self._deployment

    def _ensure_sweep(self) -> None:
        # Ray starts an async actor's loop after __init__, so the sweep starts with the first call.
        if self._sweep is None or self._sweep.done():
            self._sweep = asyncio.get_running_loop().create_task(self._sweep_forever())

    async def register_engine(self, entry: EngineEntry, handle: Any) -> None:
        """Add or replace (a restarted actor brings a new engine_id and address) one engine."""
        self._ensure_sweep()
        self._engines[entry.name] = entry
        self._handles[entry.name] = handle

    async def drain_engine(self, name: str) -> bool:
        """Mark an engine draining: gateways stop routing to it; False when it is not registered."""
        self._ensure_sweep()
        self._draining.add(name)
        return name in self._engines

    async def forget_engine(self, name: str) -> None:
        """Remove an engine for good (scale-down killed it)."""
        self._engines.pop(name, None)
        self._handles.pop(name, None)
        self._draining.discard(name)

    async def engines(self) -> list[EngineEntry]:
        """The registered engines, draining ones flagged."""
        self._ensure_sweep()
        return [replace(e, draining=e.name in self._draining) for e in self._engines.values()]

    async def register_gateway(self, entry: GatewayEntry) -> None:
        """Add or replace one gateway replica."""
        self._ensure_sweep()
        self._gateways[entry.name] = entry

    async def forget_gateway(self, name: str) -> None:
        """Remove a gateway replica (scale-down or `ray down`)."""
        self._gateways.pop(name, None)

    async def gateways(self) -> list[GatewayEntry]:
        """The registered gateway replicas."""
        return list(self._gateways.values())

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.ping_interval_s)  # a period, not synchronisation
            await asyncio.gather(*(self._check(name) for name in list(self._engines)))

    async def _check(self, name: str) -> None:
        """Drop `name` unless its actor answers with the engine_id registered (an older incarnation's is stale)."""
        entry, handle = self._engines.get(name), self._handles.get(name)
        if entry is None or handle is None:
            return
        answer: str | None = None
        with contextlib.suppress(Exception):  # dead, restarting or timed out: all mean "not this incarnation"
            answer = await asyncio.wait_for(handle.engine_id.remote(), self.ping_timeout_s)
        if answer != entry.engine_id and self._engines.get(name) is entry:
            self._engines.pop(name, None)
            self._handles.pop(name, None)
