"""ModelRouter: several models behind one gateway, each with its own engines.

A request names its model; the router hands it to that model's engines (an `EngineRouter` when a
model has several, which then picks by prefix affinity and load as for one model). The gateway holds
the ModelRouter as its one `EngineClient`: what is per request (abort, live_request, cancel_task,
weights) reaches every model's engines, `stats()` adds all of them up, and `model_name`, the tokenizer
and the limits are the first model's, so code that knows nothing of models keeps working. What does
know: `model_client(engine, name)` (the engine of one model, None for a model not served) and
`served_models(engine)`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

from engine.core.limits import RequestCaps
from engine.core.outputs import EngineStats, RequestInfo, RequestOutput
from engine.core.request import RequestMeta
from engine.core.sampling_params import SamplingParams
from engine.core.trace import IterationTrace
from engine.serving.boundary.client import EngineClient
from engine.serving.boundary.front import OutputStream, Sink
from routing.config import RoutingSettings
from routing.loads import EngineLoad, engine_loads
from routing.router import EngineRouter
from routing.stats import aggregate_stats, merge_traces


class ModelRouter:
    """An EngineClient over the engines of several models, keyed by the name each engine announces."""

    def __init__(self, groups: dict[str, EngineClient]) -> None:
        if not groups:
            raise ValueError("a ModelRouter needs at least one model")
        self.groups = dict(groups)
        first = next(iter(self.groups.values()))
        self.model_name = first.model_name
        self.max_model_len = first.max_model_len
        self.tokenizer = first.tokenizer

    @classmethod
    def of(cls, engines: Iterable[tuple[str, EngineClient]], settings: RoutingSettings) -> ModelRouter:
        """Group started engines by the model each serves (in order of first appearance); a model with
        several engines gets an EngineRouter over them."""
        by_model: dict[str, list[tuple[str, EngineClient]]] = {}
        for key, client in engines:
            by_model.setdefault(client.model_name, []).append((key, client))
        return cls({name: EngineRouter(members, settings) for name, members in by_model.items()})

    def names(self) -> list[str]:
        """The served model names, the default (first) one first."""
        return list(self.groups)

    def _all(self) -> list[EngineClient]:
        return list(self.groups.values())

    @property
    def caps(self) -> RequestCaps:
        """The first model's caps (requests are checked against their own model's: `model_client`)."""
        return self._all()[0].caps

    @property
    def is_alive(self) -> bool:
        """True while any model's engine is alive."""
        return any(c.is_alive for c in self._all())

    def bind(self, loop: Any) -> None:
        """Read every attached engine on `loop` from now (their heartbeats), as EngineRouter.bind."""
        for client in self._all():
            bind = getattr(client, "bind", None)
            if bind is not None:
                bind(loop)

    def start(self) -> None:
        """Start every model's engines."""
        for client in self._all():
            client.start()

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop every model's engines."""
        for client in self._all():
            client.shutdown(timeout_s)

    def generate(
        self, prompt_token_ids: Sequence[int], params: SamplingParams, meta: RequestMeta, request_id: str
    ) -> AsyncIterator[RequestOutput]:
        """Generate on the default model (the gateway submits through `model_client` instead)."""
        return self._all()[0].generate(prompt_token_ids, params, meta, request_id)

    def submit(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        meta: RequestMeta,
        request_id: str,
        sink: Sink | None = None,
    ) -> OutputStream:
        """Submit to the default model (the gateway submits through `model_client` instead)."""
        return self._all()[0].submit(prompt_token_ids, params, meta, request_id, sink)

    def abort(self, request_id: str, reason: str = "cancelled") -> bool:
        """Cancel a live request on whichever model's engine holds it."""
        return any(c.abort(request_id, reason) for c in self._all())

    def cancel_task(self, task_id: str) -> list[str]:
        """Cancel a task's live requests on every model's engines."""
        return [rid for c in self._all() for rid in c.cancel_task(task_id)]

    def live_request(self, request_id: str) -> RequestInfo | None:
        """The owner of a live request, from whichever model's engine holds it."""
        for client in self._all():
            info = client.live_request(request_id)
            if info is not None:
                return info
        return None

    def set_tenant_weight(self, tenant_id: str, weight: float, priority: int | None = None) -> None:
        """A tenant's weight on every model's engines."""
        for client in self._all():
            client.set_tenant_weight(tenant_id, weight, priority)

    def stats(self) -> EngineStats:
        """Every model's engines added up (routing/stats.py)."""
        snapshots = [c.stats() for c in self._all()]
        alive = [s for s in snapshots if s.alive]
        merged = aggregate_stats(alive or snapshots)
        merged.alive = bool(alive)
        return merged

    def recent_traces(self, n: int = 50) -> list[IterationTrace]:
        """The last `n` iteration traces of every engine, in time order."""
        return merge_traces([c.recent_traces(n) for c in self._all()], n)

    def engine_loads(self) -> list[EngineLoad]:
        """Each engine of each model, its row naming the model."""
        return [load for c in self._all() for load in engine_loads(c)]

    def clients(self) -> list[EngineClient]:
        """Every engine of every model (the gateway asks attached ones for their produced tokens)."""
        out: list[EngineClient] = []
        for client in self._all():
            members = getattr(client, "clients", None)
            out.extend(members() if callable(members) else [client])
        return out


def served_models(engine: EngineClient) -> list[EngineClient]:
    """One client per served model (the default first): a ModelRouter's groups, or the engine itself."""
    return list(engine.groups.values()) if isinstance(engine, ModelRouter) else [engine]


def model_client(engine: EngineClient, name: str) -> EngineClient | None:
    """The engine(s) serving model `name`, None when no engine behind `engine` serves it."""
    if isinstance(engine, ModelRouter):
        return engine.groups.get(name)
    return engine if engine.model_name == name else None
