"""Per-engine status for /metrics, the admin API and the dashboard, from a router or a lone engine."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.core.outputs import EngineStats
from engine.serving.boundary.client import EngineClient

LOCAL_KEY = "local"  # the key a gateway's only engine shows under when no router names it


@dataclass(frozen=True)
class EngineLoad:
    """One engine's health, load and what this gateway routed to it."""

    key: str
    alive: bool
    waiting: int
    waiting_tokens: int
    running: int
    kv_blocks_used: int
    kv_blocks_total: int
    in_flight: int | None = None  # this gateway's requests live there (None: not counted, no router)
    routed: int | None = None  # requests this gateway routed there since it joined (None: no router)
    leaving: bool = False  # removed from the rotation, finishing what it has
    suspect: bool = False  # alive but silent past the heartbeat bound: no new requests while others are alive
    address: str | None = None
    engine_id: str | None = None
    model: str | None = None  # the model name the engine serves
    pid: int | None = None  # a local engine worker's process id (None: attached, or a thread engine)

    @classmethod
    def of(cls, key: str, client: Any, stats: EngineStats, **extra: Any) -> EngineLoad:
        """The load of `client` from its stats snapshot; a remote engine's address and id when it has them."""
        return cls(
            key=key,
            alive=bool(client.is_alive),
            suspect=is_suspect(client),
            waiting=stats.waiting,
            waiting_tokens=stats.waiting_tokens,
            running=stats.running,
            kv_blocks_used=stats.kv_blocks_used,
            kv_blocks_total=stats.kv_blocks_total,
            address=_text(getattr(client, "address", None)),
            engine_id=_text(getattr(client, "engine_id", None)),
            model=_text(getattr(client, "model_name", None)),
            pid=_pid(getattr(client, "pid", None)),
            **extra,
        )

    @property
    def kv_use(self) -> float:
        """Share of the KV cache in use."""
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0


def is_suspect(client: Any) -> bool:
    """True while an attached engine is silent past its heartbeat bound (engine/serving/remote/liveness.py); an
    engine this process runs itself is never suspect (its death is seen directly)."""
    return bool(getattr(client, "is_suspect", False))


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _pid(value: Any) -> int | None:
    return value if isinstance(value, int) else None


def engine_loads(engine: EngineClient) -> list[EngineLoad]:
    """Each engine behind `engine`: a router's members, or the one engine itself."""
    members = getattr(engine, "engine_loads", None)
    if callable(members):
        return list(members())
    key = _text(getattr(engine, "address", None)) or LOCAL_KEY
    return [EngineLoad.of(key, engine, engine.stats())]
