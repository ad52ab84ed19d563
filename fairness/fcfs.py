"""First come, first served: the baseline every fair policy is measured against."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Generic

from fairness.base import T
from fairness.cost import TokenCost, check_weight, item_scale
from fairness.keys import KeyFn, tenant_key
from fairness.queue import LazyQueue
from fairness.victim import lowest_class, preemptible


class FCFSPolicy(Generic[T]):
    """Admit in arrival order; preempt the latest arrival of the lowest class; charge service only to report it."""

    def __init__(self, cost: TokenCost, key_fn: KeyFn = tenant_key) -> None:
        self.cost = cost
        self.key_fn = key_fn
        self._queue: LazyQueue[T] = LazyQueue()
        self._service: dict[str, float] = defaultdict(float)

    def add(self, item: T, now: float, front: bool = False) -> None:
        """Queue at the tail, or at the head for a preempted request."""
        self._queue.push(item, front)

    def remove(self, item: T) -> None:
        """Drop a queued item if present (O(1): lazy deletion)."""
        self._queue.discard(item)

    def peek(self, now: float) -> T | None:
        """Oldest queued item."""
        return self._queue.head()

    def pop(self, item: T) -> None:
        """Remove the admitted item."""
        self._queue.discard(item)

    def rank(self, item: T) -> tuple[float, ...]:
        """Arrival order."""
        return (item.meta.arrival_time,)

    def charge(self, item: T, prefill: int, decode: int, cached: int) -> float:
        """Record service for reporting; FCFS does not order by it."""
        cost = self.cost(prefill, decode, cached) * item_scale(item)
        self._service[self.key_fn(item)] += cost
        return cost

    def charge_decodes(self, items: Sequence[T]) -> float:
        """One decode token for each item (service only, as `charge`)."""
        cost = self.cost(0, 1, 0)
        service, key_fn = self._service, self.key_fn
        for item in items:
            service[key_fn(item)] += cost
        return cost

    def victim(self, running: Sequence[T], for_item: T | None = None) -> T | None:
        """The latest arrival of the least important class that `for_item` may preempt."""
        candidates = lowest_class(preemptible(running, for_item))
        if not candidates:
            return None
        return max(candidates, key=lambda r: r.meta.arrival_time)

    def finish(self, item: T) -> None:
        """FCFS keeps no per-request state past admission."""

    def set_weight(self, key: str, weight: float) -> None:
        """Accepted for interface parity; FCFS ignores weights."""
        check_weight(key, weight)

    def service(self) -> Mapping[str, float]:
        """Charged service by fairness key."""
        return dict(self._service)

    def counters(self) -> Mapping[str, float]:
        """FCFS keeps no virtual counters."""
        return {}

    def waiting(self) -> Mapping[str, int]:
        """Queued items by fairness key (O(queue); for metrics)."""
        counts: dict[str, int] = defaultdict(int)
        for item in self._queue:
            counts[self.key_fn(item)] += 1
        return dict(counts)

    def __contains__(self, item: object) -> bool:
        return getattr(item, "request_id", None) in self._queue

    def __len__(self) -> int:
        return len(self._queue)
