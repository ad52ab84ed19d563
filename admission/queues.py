"""Bounded admission queues: requests admitted at this edge that have not started producing output."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass
class QueueBounds:
    """Global bounds on queued work, and the per-tenant request bound used when a tenant sets none."""

    max_queued_requests: int
    max_queued_tokens: int
    default_tenant_queued_requests: int

    def validate(self) -> None:
        """Raise ValueError naming the first bad bound."""
        for name in ("max_queued_requests", "max_queued_tokens", "default_tenant_queued_requests"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")


@dataclass
class QueueSlot:
    """One admitted request's place in the queue; `start()` or `release()` gives it back exactly once."""

    tenant_id: str
    tokens: int
    _queues: AdmissionQueues = field(repr=False)
    _released: bool = False

    def start(self) -> None:
        """The request produced its first output: it no longer counts as queued."""
        self.release()

    def release(self) -> None:
        """The request left the queue (started, finished, failed or cancelled). Idempotent."""
        if not self._released:
            self._released = True
            self._queues._leave(self)


@dataclass(frozen=True)
class QueueFull:
    """Why a request was not queued, and by how much the bound was exceeded."""

    scope: str  # "tenant" or "global"
    message: str
    excess_requests: int
    excess_tokens: int


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
        self._by_tenant: dict[str, int] = {}

    def try_enter(self, tenant_id: str, tokens: int, tenant_bound: int | None) -> QueueSlot | QueueFull:
        """Take a slot for a request of `tokens` prompt tokens, or say which bound it would break."""
        bound = tenant_bound if tenant_bound is not None else self.bounds.default_tenant_queued_requests
        with self._lock:
            own = self._by_tenant.get(tenant_id, 0)
            if own + 1 > bound:
                return QueueFull(
                    "tenant",
                    f"tenant has {own} queued requests, its bound is {bound}",
                    excess_requests=own + 1 - bound,
                    excess_tokens=0,
                )
            over_requests = self._requests + 1 - self.bounds.max_queued_requests
            over_tokens = self._tokens + tokens - self.bounds.max_queued_tokens
            # A single request larger than the whole token bound may enter an empty queue.
            if over_requests > 0 or (over_tokens > 0 and self._requests > 0):
                return QueueFull(
                    "global",
                    f"server queue is full ({self._requests} requests, {self._tokens} prompt tokens queued)",
                    excess_requests=max(over_requests, 0),
                    excess_tokens=max(over_tokens, 0),
                )
            self._requests += 1
            self._tokens += tokens
            self._by_tenant[tenant_id] = own + 1
            return QueueSlot(tenant_id, tokens, self)

    def _leave(self, slot: QueueSlot) -> None:
        with self._lock:
            self._requests -= 1
            self._tokens -= slot.tokens
            left = self._by_tenant.get(slot.tenant_id, 0) - 1
            if left > 0:
                self._by_tenant[slot.tenant_id] = left
            else:
                self._by_tenant.pop(slot.tenant_id, None)

    def queued(self, tenant_id: str | None = None) -> int:
        """Queued requests overall, or for one tenant."""
        with self._lock:
            return self._requests if tenant_id is None else self._by_tenant.get(tenant_id, 0)

    def queued_tokens(self) -> int:
        """Queued prompt tokens overall."""
        with self._lock:
            return self._tokens
