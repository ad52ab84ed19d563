"""Bounded admission queues, shared by weight: requests admitted at this edge that have not started yet.

The server-wide bounds (queued requests and queued prompt tokens) are divided among the backlogged
tenants (those with a queued request, and the one arriving) in proportion to their weights. A tenant may
borrow what the others leave idle, so a lone tenant can fill the queue. When the queue is full, a request
from a tenant that stays within its share still enters: the newest queued requests of the tenant furthest
over its share are pushed out to make room (buffer management as fair queueing does it, e.g. Longest Queue
Drop); between tenants equally far over, the one pushed out least recently (ties rotate). Only when no backlogged tenant is over its share is the arrival refused as `global`.

A tenant's load is the larger of its two fractions of its share, `max(requests / share_of_requests,
tokens / share_of_tokens)`; over its share means a load above 1.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class QueueBounds:
    """Global bounds on queued work, and the per-tenant request bound used when a tenant sets none.

    Their defaults (GatewaySettings) are consistent: a tenant's default bound (64 requests) is a quarter of
    the server's, and even at a 2,048-token context its requests fill half the token bound, never all of it;
    a tenant with a larger bound of its own borrows the rest while nobody else needs it, and gives it back by
    push-out (docs/gateway.md, "Fair admission").
    """

    max_queued_requests: int
    max_queued_tokens: int
    default_tenant_queued_requests: int

    def validate(self) -> None:
        """Raise ValueError naming the first bad bound."""
        for name in ("max_queued_requests", "max_queued_tokens", "default_tenant_queued_requests"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")


@dataclass(eq=False)
class QueueSlot:
    """One admitted request's place in the queue; `start()` or `release()` gives it back exactly once.

    `pushed_out` turns True when a tenant under its share took the place; `on_push_out` (set by whoever
    runs the request) is then called once, outside the queue's lock, to abort the request and answer 429.
    """

    tenant_id: str
    tokens: int
    _queues: AdmissionQueues = field(repr=False)
    pushed_out: bool = False
    on_push_out: Callable[[QueueSlot], None] | None = field(default=None, repr=False)

    def start(self) -> None:
        """The request produced its first output: it no longer counts as queued."""
        self.release()

    def release(self) -> None:
        """The request left the queue (started, finished, failed or cancelled). Idempotent."""
        self._queues._leave(self)


@dataclass(frozen=True)
class QueueFull:
    """Why a request was not queued, and by how much the bound was exceeded."""

    scope: str  # "tenant" (its own bound), "share" (over its share of a full queue) or "global"
    message: str
    excess_requests: int
    excess_tokens: int


@dataclass
class _Backlog:
    """One backlogged tenant: its weight and its queued slots, oldest first."""

    weight: float
    tokens: int = 0
    slots: dict[int, QueueSlot] = field(default_factory=dict)  # id(slot) -> slot, in arrival order
    pushed_at: int = -1  # the push-out (server-wide count) that last took one of its slots; -1: none yet


class AdmissionQueues:
    """Thread-safe counters of queued requests and prompt tokens, per tenant and overall.

    The gateway, not the engine, counts here: a check and an increment under one lock cannot be
    raced by concurrent arrivals, which a snapshot of engine stats could be.
    """

    def __init__(self, bounds: QueueBounds) -> None:
        bounds.validate()
        self.bounds = bounds
        self._lock = threading.Lock()
        self._requests = 0
        self._tokens = 0
        self._tenants: dict[str, _Backlog] = {}
        self._push_outs = 0  # push-outs so far: orders ties between equally loaded tenants

    def try_enter(
        self, tenant_id: str, tokens: int, tenant_bound: int | None, weight: float = 1.0
    ) -> QueueSlot | QueueFull:
        """Take a slot for a request of `tokens` prompt tokens (pushing out over-share work if the queue is
        full and this tenant stays within its share), or say which bound it would break."""
        bound = tenant_bound if tenant_bound is not None else self.bounds.default_tenant_queued_requests
        with self._lock:
            backlog = self._tenants.get(tenant_id)
            own = len(backlog.slots) if backlog is not None else 0
            if own + 1 > bound:
                return QueueFull(
                    "tenant",
                    f"tenant has {own} queued requests, its bound is {bound}",
                    excess_requests=own + 1 - bound,
                    excess_tokens=0,
                )
            over_requests = self._requests + 1 - self.bounds.max_queued_requests
            over_tokens = self._tokens + tokens - self.bounds.max_queued_tokens
            victims: list[QueueSlot] = []
            # A single request larger than the whole token bound may enter an empty queue.
            if over_requests > 0 or (over_tokens > 0 and self._requests > 0):
                found = self._victims(tenant_id, tokens, weight)
                if not isinstance(found, list):
                    return self._full(found == "over_share" and own > 0, over_requests, over_tokens)
                victims = found
                for victim in victims:
                    victim.pushed_out = True
                    self._tenants[victim.tenant_id].pushed_at = self._push_outs
                    self._push_outs += 1
                    self._remove(victim)
            slot = QueueSlot(tenant_id, tokens, self)
            backlog = self._tenants.setdefault(tenant_id, _Backlog(weight))
            backlog.weight = weight
            backlog.slots[id(slot)] = slot
            backlog.tokens += tokens
            self._requests += 1
            self._tokens += tokens
        for victim in victims:  # outside the lock: the callback aborts an engine request
            if victim.on_push_out is not None:
                victim.on_push_out(victim)
        return slot

    def _full(self, over_share: bool, over_requests: int, over_tokens: int) -> QueueFull:
        """The refusal of an arrival no push-out can make room for: over its share while it holds queued
        work is its own doing ("share", a 429); else the queue is full with everyone at share ("global")."""
        why = "this tenant is at its share of it" if over_share else "every backlogged tenant is at its share"
        return QueueFull(
            "share" if over_share else "global",
            f"server queue is full ({self._requests} requests, {self._tokens} prompt tokens queued) and {why}",
            excess_requests=max(over_requests, 0),
            excess_tokens=max(over_tokens, 0),
        )

    def _victims(self, tenant_id: str, tokens: int, weight: float) -> list[QueueSlot] | str | None:
        """The newest slots of the most over-share tenants whose removal makes room for the arrival;
        "over_share" when the arrival would put its own tenant over its share; None when not enough
        queued work is over its share to make room."""
        weights = {t: b.weight for t, b in self._tenants.items()} | {tenant_id: weight}
        total_weight = sum(weights.values())
        counts = {t: [len(b.slots), b.tokens] for t, b in self._tenants.items()}
        mine = counts.setdefault(tenant_id, [0, 0])
        mine[0] += 1
        mine[1] += tokens

        def load(t: str) -> float:
            share = weights[t] / total_weight
            return max(
                counts[t][0] / (self.bounds.max_queued_requests * share),
                counts[t][1] / (self.bounds.max_queued_tokens * share),
            )

        if load(tenant_id) > 1.0:
            return "over_share"
        queued = {t: list(b.slots.values()) for t, b in self._tenants.items() if t != tenant_id}
        # Ties in load rotate: the tenant hit least recently goes first (hit in this call counts too), so at
        # equal load push-outs take turns instead of always hitting the earliest backlogged tenant.
        pushed_at = {t: self._tenants[t].pushed_at for t in queued}
        requests, queued_tokens = self._requests + 1, self._tokens + tokens
        victims: list[QueueSlot] = []
        while requests > self.bounds.max_queued_requests or (
            queued_tokens > self.bounds.max_queued_tokens and requests > 1
        ):
            over = [t for t, slots in queued.items() if slots and load(t) > 1.0]
            if not over:
                return None
            chosen = max(over, key=lambda t: (round(load(t), 9), -pushed_at[t]))
            pushed_at[chosen] = self._push_outs + len(victims)
            victim = queued[chosen].pop()
            victims.append(victim)
            counts[victim.tenant_id][0] -= 1
            counts[victim.tenant_id][1] -= victim.tokens
            requests -= 1
            queued_tokens -= victim.tokens
        return victims

    def _remove(self, slot: QueueSlot) -> bool:
        """Take `slot` out of the counters (the lock held); False when it had already left."""
        backlog = self._tenants.get(slot.tenant_id)
        if backlog is None or backlog.slots.pop(id(slot), None) is None:
            return False
        backlog.tokens -= slot.tokens
        if not backlog.slots:
            del self._tenants[slot.tenant_id]
        self._requests -= 1
        self._tokens -= slot.tokens
        return True

    def _leave(self, slot: QueueSlot) -> None:
        with self._lock:
            self._remove(slot)

    def could_enter(self, tenant_id: str, weight: float) -> bool:
        """False when the request bound is reached and one more request would put this tenant over its
        share (so no push-out could admit it): the cheap check before a body is read."""
        with self._lock:
            if self._requests < self.bounds.max_queued_requests:
                return True
            backlog = self._tenants.get(tenant_id)
            total = sum(b.weight for t, b in self._tenants.items() if t != tenant_id) + weight
            own = len(backlog.slots) if backlog is not None else 0
            return own + 1 <= self.bounds.max_queued_requests * weight / total

    def queued(self, tenant_id: str | None = None) -> int:
        """Queued requests overall, or for one tenant."""
        with self._lock:
            if tenant_id is None:
                return self._requests
            backlog = self._tenants.get(tenant_id)
            return len(backlog.slots) if backlog is not None else 0

    def queued_tokens(self) -> int:
        """Queued prompt tokens overall."""
        with self._lock:
            return self._tokens
