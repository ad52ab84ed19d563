"""EngineRouter: one EngineClient over many engines, each request sent to the engine the scorer picks.

The gateway holds it exactly as it would hold one engine (engine/serving/boundary/client.py). A request goes to the
healthy engine with the best score (routing/score.py: prefix affinity against load), and the router
remembers which engine serves it until its stream ends, so abort, live_request and a replay's attach
reach that engine. Membership changes at run time (`add_engine`, `remove_engine`): a removed engine
takes no new requests but keeps the ones it has, which finish there (or fail when its owner shuts it).

Load between stats snapshots: an engine publishes stats once per iteration, and a burst arrives faster
than that, so the router adds what it sent since the engine's last snapshot (`pending_*`, cleared
when the engine's iteration count moves on) and never believes an engine has fewer requests than this
router itself has live there. Without that, every request of a burst would see the same snapshot and
land on the same engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial

from engine.core.errors import DuplicateRequestError
from engine.core.limits import RequestCaps
from engine.core.outputs import EngineStats, RequestInfo
from engine.core.request import RequestMeta
from engine.core.sampling_params import SamplingParams
from engine.core.tokenizer import Tokenizer
from engine.core.trace import IterationTrace
from engine.serving.boundary.client import EngineClient
from engine.serving.boundary.front import GenerateOverSubmit, OutputStream, Sink
from engine.serving.boundary.messages import EngineDeadError
from routing.affinity import DigestMemory, prefix_digests
from routing.config import RoutingSettings
from routing.loads import EngineLoad, is_suspect
from routing.score import Candidate, rank
from routing.stats import aggregate_stats, merge_traces


@dataclass(eq=False)
class _Member:
    """One engine in the rotation (or leaving it) and this router's bookkeeping of it."""

    key: str
    client: EngineClient
    memory: DigestMemory
    was_alive: bool
    in_flight: int = 0  # this router's requests live there
    tenant_in_flight: Counter[str] = field(default_factory=Counter)  # the same, per tenant
    routed: int = 0  # requests routed there since it joined
    pending_requests: int = 0  # routed since its last stats snapshot
    pending_tokens: int = 0
    seen_iteration: int = -1
    leaving: bool = False

    @property
    def block_size(self) -> int | None:
        """The engine's KV block size once it has reported its limits (EngineFront.limits)."""
        limits = getattr(self.client, "limits", None)
        size = getattr(limits, "block_size", None)
        return size if isinstance(size, int) and size > 0 else None


def tightest_caps(caps: Sequence[RequestCaps]) -> RequestCaps:
    """Caps every engine accepts: each field's smallest value, so a request checked at the edge fits anywhere."""
    return RequestCaps(**{name: min(getattr(c, name) for c in caps) for name in RequestCaps.model_fields})


class EngineRouter(GenerateOverSubmit):
    """An EngineClient over named engines that all serve one model (`generate` is the fronts' own, over
    this `submit`, which routes)."""

    model_name: str
    max_model_len: int
    tokenizer: Tokenizer

    def __init__(
        self,
        engines: Mapping[str, EngineClient] | Iterable[tuple[str, EngineClient]],
        settings: RoutingSettings | None = None,
    ) -> None:
        items = list(engines.items() if isinstance(engines, Mapping) else engines)
        if not items:
            raise ValueError(
                "an EngineRouter needs at least one engine: it names the model and its tokenizer"
            )
        self.settings = settings or RoutingSettings()
        self._members: dict[str, _Member] = {}
        self._leaving: list[_Member] = []
        self._routes: dict[str, _Member] = {}
        self._weights: dict[str, tuple[float, int | None]] = {}
        self._lock = threading.RLock()
        first = items[0][1]
        self.model_name = first.model_name
        self.tokenizer = first.tokenizer
        self.max_model_len = first.max_model_len
        self._caps: RequestCaps = first.caps
        for key, client in items:
            self.add_engine(key, client)

    # -- membership ---------------------------------------------------------------------------
    def add_engine(self, key: str, client: EngineClient) -> None:
        """Put an engine into the rotation; it gets every tenant weight set so far.

        Refused (ValueError) for a key already routed to, or an engine serving another model: one model
        name must mean one model, whichever engine answers.
        """
        if client.model_name != self.model_name:
            raise ValueError(
                f"engine {key!r} serves model {client.model_name!r}, but this router serves "
                f"{self.model_name!r}: engines of different models cannot share one name"
            )
        with self._lock:
            if key in self._members:
                raise ValueError(f"engine {key!r} is already in the rotation")
            self._members[key] = _Member(
                key, client, DigestMemory(self.settings.affinity_entries), was_alive=client.is_alive
            )
            self._refit()
        self._replay_weights(client)

    def remove_engine(self, key: str) -> EngineClient | None:
        """Take an engine out of the rotation and return it (None: no such key); the router does not stop it.

        Its live requests stay reachable (abort, cancel, live_request) until they end there; shutting the
        returned client down ends them as that engine ends them (cancelled, or a retryable failure).
        """
        with self._lock:
            member = self._members.pop(key, None)
            if member is None:
                return None
            if member.in_flight:
                member.leaving = True
                self._leaving.append(member)
            self._refit()
        return member.client

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Read every engine that was started before `loop` existed on it from now (remote engines' heartbeats)."""
        for m in self._everyone():
            bind = getattr(m.client, "bind", None)
            if bind is not None:
                bind(loop)

    def keys(self) -> list[str]:
        """The engines in the rotation."""
        with self._lock:
            return list(self._members)

    def _refit(self) -> None:
        """Context and caps every member accepts (kept from before when the rotation is empty)."""
        clients = [m.client for m in self._members.values()]
        if clients:
            self.max_model_len = min(c.max_model_len for c in clients)
            self._caps = tightest_caps([c.caps for c in clients])

    def _replay_weights(self, client: EngineClient) -> None:
        with self._lock:
            weights = list(self._weights.items())
        for tenant_id, (weight, priority) in weights:
            with contextlib.suppress(EngineDeadError):
                client.set_tenant_weight(tenant_id, weight, priority)

    def members(self) -> list[tuple[str, EngineClient]]:
        """(key, engine) for every engine in the rotation (not those leaving it): their health, for /readyz."""
        with self._lock:
            return [(m.key, m.client) for m in self._members.values()]

    def clients(self) -> list[EngineClient]:
        """Every engine in the rotation or leaving it (the gateway asks each for its produced tokens)."""
        return [m.client for m in self._everyone()]

    def _everyone(self) -> list[_Member]:
        with self._lock:
            return [*self._members.values(), *self._leaving]

    # -- choosing an engine ---------------------------------------------------------------------
    def _observe(self, m: _Member) -> bool:
        """Health now; on a change (death, or a return with an empty cache) forget its affinity and pending."""
        alive = m.client.is_alive
        if alive != m.was_alive:
            m.was_alive = alive
            m.memory.clear()
            m.pending_requests = m.pending_tokens = 0
            if alive:  # a fresh engine: it has none of the weights set while it was away
                self._replay_weights(m.client)
        return alive

    def _candidate(self, m: _Member, alive: bool, affinity: float, tenant_id: str = "") -> Candidate:
        s = m.client.stats()
        if s.iterations != m.seen_iteration:  # a new snapshot counts what was routed before it
            m.seen_iteration = s.iterations
            m.pending_requests = m.pending_tokens = 0
        waiting = max(s.waiting + m.pending_requests, m.in_flight - s.running)
        return Candidate(
            healthy=alive,
            waiting=waiting,
            waiting_tokens=s.waiting_tokens + m.pending_tokens,
            running=s.running,
            kv_blocks_used=s.kv_blocks_used,
            kv_blocks_total=s.kv_blocks_total,
            max_num_seqs=s.max_num_seqs,
            kv_capacity_tokens=s.kv_blocks_total * (m.block_size or 1),
            affinity=affinity,
            in_flight=m.in_flight,
            tenant_in_flight=m.tenant_in_flight[tenant_id],
        )

    def _ranked(
        self, prompt_token_ids: Sequence[int], meta: RequestMeta
    ) -> tuple[list[_Member], dict[int, list[bytes]]]:
        """Healthy members best first, then suspect ones, and the prompt's digests per block size (to
        remember at the chosen one).

        A suspect engine (alive, but silent past the heartbeat bound: engine/serving/remote/liveness.py) gets a new
        request only when no healthy one takes it. A lone engine that is suspect still gets them: they
        wait on its connection and run when it speaks again (a starved process, the common case), or fail
        with the retryable 503 when it is lost; refusing them would turn every pause into an outage.
        """
        w = self.settings
        members = list(self._members.values())
        digests: dict[int, list[bytes]] = {}
        candidates = []
        suspects: list[_Member] = []
        for m in members:
            alive = self._observe(m)
            if alive and is_suspect(m.client):
                suspects.append(m)
                alive = False  # not among the healthy: ranked after them below
            affinity = 0.0
            size = m.block_size
            if alive and size is not None and w.affinity_weight > 0:
                if size not in digests:
                    digests[size] = prefix_digests(prompt_token_ids, meta, size, w.affinity_blocks)
                affinity = m.memory.matched(digests[size]) / w.affinity_blocks
            candidates.append(self._candidate(m, alive, affinity, meta.tenant_id))
        fallback = rank([self._candidate(m, True, 0.0, meta.tenant_id) for m in suspects], w)
        return [members[i] for i in rank(candidates, w)] + [suspects[i] for i in fallback], digests

    def _routed(
        self, m: _Member, request_id: str, tenant_id: str, prompt_tokens: int, digests: dict[int, list[bytes]]
    ) -> None:
        with self._lock:
            self._routes[request_id] = m
            m.in_flight += 1
            m.tenant_in_flight[tenant_id] += 1
            m.routed += 1
            m.pending_requests += 1
            m.pending_tokens += prompt_tokens
            size = m.block_size
            if size is not None and size in digests:
                m.memory.remember(digests[size])

    def _ended(self, request_id: str, tenant_id: str, m: _Member) -> None:
        with self._lock:
            if self._routes.get(request_id) is m:
                del self._routes[request_id]
            m.in_flight -= 1
            m.tenant_in_flight[tenant_id] -= 1
            if m.tenant_in_flight[tenant_id] <= 0:
                del m.tenant_in_flight[tenant_id]
            if m.leaving and m.in_flight <= 0 and m in self._leaving:
                self._leaving.remove(m)

    # -- the EngineClient surface ------------------------------------------------------------------
    @property
    def caps(self) -> RequestCaps:
        """The tightest caps of the engines in the rotation."""
        return self._caps

    @property
    def is_alive(self) -> bool:
        """True while any engine in the rotation is alive."""
        return any(m.client.is_alive for m in self._everyone() if not m.leaving)

    def start(self) -> None:
        """Start every engine in the rotation that is not running."""
        for m in self._everyone():
            if not m.leaving and not m.client.is_alive:
                m.client.start()

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop every engine this router holds, leaving ones included."""
        for m in self._everyone():
            m.client.shutdown(timeout_s)

    def submit(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        meta: RequestMeta,
        request_id: str,
        sink: Sink | None = None,
    ) -> OutputStream:
        """Send the request to the best healthy engine (the next one if that engine just died).

        Raises EngineDeadError when no engine takes it (the gateway answers a retryable 503), and the
        engine's own InvalidRequestError when the request is at fault (no other engine is tried).
        """
        with self._lock:
            if request_id in self._routes:
                raise DuplicateRequestError(f"request id {request_id!r} is already live", "request_id")
            order, digests = self._ranked(prompt_token_ids, meta)
        failure: EngineDeadError | None = None
        for m in order:
            try:
                stream = m.client.submit(prompt_token_ids, params, meta, request_id, sink)
            except EngineDeadError as exc:
                failure = exc
                continue
            self._routed(m, request_id, meta.tenant_id, len(prompt_token_ids), digests)
            stream.when_ended(partial(self._ended, request_id, meta.tenant_id, m))
            return stream
        raise EngineDeadError(f"no engine is alive ({failure})" if failure else "no engine is alive")

    def engine_of(self, request_id: str) -> str | None:
        """The key of the engine serving a live request."""
        with self._lock:
            m = self._routes.get(request_id)
            return m.key if m is not None else None

    def abort(self, request_id: str, reason: str = "cancelled") -> bool:
        """Cancel a live request on the engine serving it."""
        with self._lock:
            m = self._routes.get(request_id)
        return m.client.abort(request_id, reason) if m is not None else False

    def cancel_task(self, task_id: str) -> list[str]:
        """Cancel every live request of a task, on every engine."""
        return [rid for m in self._everyone() for rid in m.client.cancel_task(task_id)]

    def live_request(self, request_id: str) -> RequestInfo | None:
        """Owner of a live request, asked of the engine serving it."""
        with self._lock:
            m = self._routes.get(request_id)
        return m.client.live_request(request_id) if m is not None else None

    def set_tenant_weight(self, tenant_id: str, weight: float, priority: int | None = None) -> None:
        """Change a tenant's weight on every engine, and on any that joins or returns later."""
        with self._lock:
            self._weights[tenant_id] = (weight, priority)
        for m in self._everyone():
            with contextlib.suppress(EngineDeadError):
                m.client.set_tenant_weight(tenant_id, weight, priority)

    def stats(self) -> EngineStats:
        """The engines' stats added up (alive ones only, unless none is)."""
        snapshots = [m.client.stats() for m in self._everyone()]
        alive = [s for s in snapshots if s.alive]
        merged = aggregate_stats(alive or snapshots)
        merged.alive = bool(alive) and self.is_alive
        return merged

    def recent_traces(self, n: int = 50) -> list[IterationTrace]:
        """The last `n` iteration traces of all engines, in time order."""
        return merge_traces([m.client.recent_traces(n) for m in self._everyone()], n)

    def engine_loads(self) -> list[EngineLoad]:
        """Each engine's health, load and routed requests, for /metrics and the dashboard."""
        return [
            EngineLoad.of(
                m.key,
                m.client,
                m.client.stats(),
                in_flight=max(m.in_flight, 0),
                routed=m.routed,
                leaving=m.leaving,
            )
            for m in self._everyone()
        ]
