"""Earliest deadline first within a class: items with a deadline go first by deadline, the rest by a base policy.

Deadlines are absolute (`meta.deadline`, epoch seconds). Accounting (charge, service, counters,
weights) stays with the base policy, so a key's deadline traffic still counts against its share.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence
from typing import Generic

from fairness.base import SchedulingPolicy, T
from fairness.errors import DuplicateItemError
from fairness.victim import lowest_class, preemptible

_HEAP_SLACK = 64


class EDFPolicy(Generic[T]):
    """Deadline heap in front of `base`; items without a deadline are ordered by `base`."""

    def __init__(self, base: SchedulingPolicy[T]) -> None:
        self.base = base
        self._heap: list[tuple[float, int, T]] = []
        self._seq_of: dict[str, int] = {}  # queued deadline item request_id -> its live heap entry
        self._next_seq = 0

    def add(self, item: T, now: float, front: bool = False) -> None:
        """Deadline items join the heap (ties: preempted first, then arrival); others go to the base policy."""
        rid = item.request_id
        if rid in self._seq_of or item in self.base:
            raise DuplicateItemError(f"request {rid!r} is already queued")
        deadline = item.meta.deadline
        if deadline is None:
            self.base.add(item, now, front)
            return
        seq = -self._next_seq if front else self._next_seq
        self._next_seq += 1
        self._seq_of[rid] = seq
        heapq.heappush(self._heap, (float(deadline), seq, item))

    def remove(self, item: T) -> None:
        """Drop a queued item; no-op when absent."""
        if self._seq_of.pop(item.request_id, None) is None:
            self.base.remove(item)
        elif len(self._heap) > 2 * len(self._seq_of) + _HEAP_SLACK:
            self._heap = [e for e in self._heap if self._seq_of.get(e[2].request_id) == e[1]]
            heapq.heapify(self._heap)

    def peek(self, now: float) -> T | None:
        """Earliest deadline, else the base policy's choice."""
        heap = self._heap
        while heap:
            _, seq, item = heap[0]
            if self._seq_of.get(item.request_id) == seq:
                return item
            heapq.heappop(heap)
        return self.base.peek(now)

    def pop(self, item: T) -> None:
        """Remove the admitted item (the base policy's own `pop` for its items: it may track running ones)."""
        if item.request_id not in self._seq_of and item in self.base:
            self.base.pop(item)
        else:
            self.remove(item)

    def rank(self, item: T) -> tuple[float, ...]:
        """Deadline items first, earliest first; the rest in the base policy's order."""
        deadline = item.meta.deadline
        return (1.0, *self.base.rank(item)) if deadline is None else (0.0, float(deadline))

    def finish(self, item: T) -> None:
        """Forwarded to the base policy, which tracks running requests per key."""
        finish = getattr(self.base, "finish", None)
        if finish is not None:
            finish(item)

    def charge(self, item: T, prefill: int, decode: int, cached: int) -> float:
        """Charged by the base policy."""
        return self.base.charge(item, prefill, decode, cached)

    def charge_decodes(self, items: Sequence[T]) -> float:
        """Charged by the base policy."""
        return self.base.charge_decodes(items)

    def victim(self, running: Sequence[T], for_item: T | None = None) -> T | None:
        """In the least important class: prefer requests without a deadline, then the base policy's rule."""
        candidates = lowest_class(preemptible(running, for_item))
        relaxed = [r for r in candidates if r.meta.deadline is None]
        if relaxed:
            return self.base.victim(relaxed)
        if not candidates:
            return None
        return max(candidates, key=lambda r: (r.meta.deadline, r.meta.arrival_time))

    def set_weight(self, key: str, weight: float) -> None:
        """Forwarded to the base policy."""
        self.base.set_weight(key, weight)

    def weights(self) -> Mapping[str, float]:
        """The base policy's current weights (none for one without weights)."""
        found: Mapping[str, float] = getattr(self.base, "weights", dict)()
        return found

    def service(self) -> Mapping[str, float]:
        """Charged service by fairness key (base policy)."""
        return self.base.service()

    def counters(self) -> Mapping[str, float]:
        """Virtual counters by fairness key (base policy)."""
        return self.base.counters()

    def local_service(self) -> Mapping[str, float]:
        """The base policy's charged service here (fairness/shared.py); none when it keeps no counters."""
        local: Callable[[], Mapping[str, float]] | None = getattr(self.base, "local_service", None)
        return local() if local is not None else {}

    def absorb_remote(self, totals: Mapping[str, float]) -> None:
        """Forwarded to the base policy when it keeps counters."""
        absorb = getattr(self.base, "absorb_remote", None)
        if absorb is not None:
            absorb(totals)

    def __contains__(self, item: object) -> bool:
        return getattr(item, "request_id", None) in self._seq_of or item in self.base

    def __len__(self) -> int:
        return len(self._seq_of) + len(self.base)
