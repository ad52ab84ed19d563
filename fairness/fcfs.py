"""First come, first served: the baseline every fair policy is measured against."""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Mapping, Sequence
from typing import Generic

from fairness.base import T


class FCFSPolicy(Generic[T]):
    """Admit in arrival order; preempt the latest arrival; charge service only to report it."""

    def __init__(self, w_in: float = 1.0, w_out: float = 2.0, w_cached: float = 0.0) -> None:
        self.w_in, self.w_out, self.w_cached = w_in, w_out, w_cached
        self._queue: deque[T] = deque()
        self._service: dict[str, float] = defaultdict(float)

    def add(self, item: T, now: float, front: bool = False) -> None:
        """Queue at the tail, or at the head for a preempted request."""
        if front:
            self._queue.appendleft(item)
        else:
            self._queue.append(item)

    def remove(self, item: T) -> None:
        """Drop a queued item if present."""
        try:
            self._queue.remove(item)
        except ValueError:
            pass

    def peek(self, now: float) -> T | None:
        """Oldest queued item."""
        return self._queue[0] if self._queue else None

    def pop(self, item: T) -> None:
        """Remove the admitted head."""
        if self._queue and self._queue[0] is item:
            self._queue.popleft()
        else:
            self.remove(item)

    def charge(self, item: T, prefill: int, decode: int, cached: int) -> float:
        """Record service for reporting; FCFS does not order by it."""
        cost = self.w_in * prefill + self.w_out * decode + self.w_cached * cached
        self._service[item.meta.tenant_id] += cost
        return cost

    def victim(self, running: Sequence[T]) -> T | None:
        """The most recent arrival loses its blocks first."""
        if not running:
            return None
        return max(running, key=lambda r: r.meta.arrival_time)

    def service(self) -> Mapping[str, float]:
        """Charged service by tenant."""
        return dict(self._service)

    def __len__(self) -> int:
        return len(self._queue)
