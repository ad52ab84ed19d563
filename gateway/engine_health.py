"""Which engines behind the gateway can serve now, engine by engine, so a dead worker refuses only its model.

An engine is up while it is alive and not marked down. A local engine found dead is marked down (by its
watcher, gateway/ops/engine_watch.py, or by a run its death failed, gateway/openai/submit.py) and stays
down until its watcher has replaced the worker and reads the new one: `is_alive` turns true a moment
earlier, while the new worker is started on a thread. A request is refused (503 `engine_unavailable`)
only when no engine of its own model is up, and the gateway stays ready while any model is
(docs/gateway.md, "Failure and shutdown"). Attached engines (`--engine`) are never marked: they rejoin by
themselves (engine/serving/remote/client.py), and `is_alive` alone says whether they serve.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine import EngineClient, ProcessEngine
from routing import EngineRouter
from routing.loads import LOCAL_KEY
from routing.models import served_models


@dataclass(frozen=True)
class ServingEngine:
    """One engine behind the gateway: its key in its model's router, its model and its client."""

    key: str  # a local model's directory, an attached engine's address, or "local" for a lone engine
    model: str
    client: EngineClient


def serving_engines(engine: EngineClient) -> list[ServingEngine]:
    """Every engine behind the gateway's `engine`, model by model (the default model first)."""
    out: list[ServingEngine] = []
    for group in served_models(engine):
        if isinstance(group, EngineRouter):
            members = group.members()
        else:
            members = [(str(getattr(group, "address", None) or LOCAL_KEY), group)]
        out += [ServingEngine(key, group.model_name, client) for key, client in members]
    return out


def process_engines(engine: EngineClient) -> list[ProcessEngine]:
    """The engines behind `engine` whose worker process this gateway runs (and so can replace)."""
    return [e.client for e in serving_engines(engine) if isinstance(e.client, ProcessEngine)]


class EngineHealth:
    """The engines marked down, each until its watcher has replaced its worker."""

    def __init__(self) -> None:
        # Keyed by id(); the value keeps the engine referenced, so its id is never reused while marked.
        self._down: dict[int, EngineClient] = {}

    def mark_down(self, engine: EngineClient) -> None:
        """`engine` serves nothing until `mark_up`."""
        self._down[id(engine)] = engine

    def mark_up(self, engine: EngineClient) -> None:
        """`engine` serves again (its watcher started a new worker and reads it)."""
        self._down.pop(id(engine), None)

    def mark_dead(self, engine: EngineClient) -> None:
        """Mark down every worker behind `engine` that this gateway runs and that is not alive (a run ended
        `engine_unavailable`). An attached engine is never marked: it rejoins by itself, and nothing would
        mark it up again (a `ray up` gateway's engines come as a router, not as `--engine` settings)."""
        for client in process_engines(engine):
            if not client.is_alive:
                self.mark_down(client)

    def up(self, engine: EngineClient) -> bool:
        """Whether one engine can take a request now."""
        return engine.is_alive and id(engine) not in self._down

    def serves(self, model_engines: EngineClient) -> bool:
        """Whether a model's engines (a client from `model_client`) can take a request: any one is up."""
        if not self._down:  # the common case, once per request: a router's is_alive is any member's
            return model_engines.is_alive
        return any(self.up(e.client) for e in serving_engines(model_engines))

    def serves_any(self, engine: EngineClient) -> bool:
        """Whether the gateway serves any model now (what readiness asks)."""
        return any(self.serves(group) for group in served_models(engine))

    def report(self, engine: EngineClient) -> list[dict[str, object]]:
        """Each engine's key, model and whether it is up, for the /readyz body."""
        return [{"key": e.key, "model": e.model, "up": self.up(e.client)} for e in serving_engines(engine)]
