"""Virtual Token Counter (Sheng et al., OSDI 2024): serve the backlogged key with the least weighted service.

One counter per fairness key grows by `cost(tokens) / weight` as tokens are scheduled. `peek` returns
the head of the backlogged key with the smallest counter; a key that becomes backlogged is lifted so
that idle time is never banked (Algorithm 2 of the paper):

* other keys backlogged: `c_u = max(c_u, min over backlogged c_i)`;
* nobody backlogged: `c_u = max(c_u, c_l)`, `l` the key that last left the waiting queue (its
  counter keeps growing while its admitted requests run, so a newcomer cannot undercut it).

Only an idle key is lifted: one with nothing queued *and nothing running*. The paper lifts on every
empty-to-nonempty queue transition, which erases the weights of closed-loop tenants: a weight-3
tenant whose few streams are all admitted has an empty queue, and each new request of its was
lifted to the weight-1 tenant's counter, giving a 50/50 split (seen on the dashboard). A key with
running requests is not idle: its counter grows with every token it is served, so it banks nothing.

Backlogged keys sit in a heap of (counter, backlog order, key) with lazy invalidation: every
counter change pushes a fresh entry and `peek` drops stale tops, so add/peek/pop/charge cost
O(log K) amortised for K backlogged keys; the heap is rebuilt once stale entries dominate.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Generic

from fairness.base import T
from fairness.cost import TokenCost, check_weight
from fairness.errors import DuplicateItemError
from fairness.keys import KeyFn, tenant_key
from fairness.queue import LazyQueue
from fairness.victim import lowest_class, preemptible

_HEAP_SLACK = 64


class VTCPolicy(Generic[T]):
    """Weighted Virtual Token Counter over fairness keys; FIFO (preempted first) within a key."""

    def __init__(self, cost: TokenCost | None = None, key_fn: KeyFn = tenant_key) -> None:
        self.cost = cost or TokenCost()
        self.key_fn = key_fn
        self._queues: dict[str, LazyQueue[T]] = {}  # backlogged keys only
        self._key_of: dict[str, str] = {}  # queued request_id -> key
        self._counters: dict[str, float] = defaultdict(float)
        self._weights: dict[str, float] = {}
        self._service: dict[str, float] = defaultdict(float)
        self._heap: list[tuple[float, int, str]] = []
        self._backlog_seq: dict[str, int] = {}  # backlogged key -> when it became backlogged (tie-break)
        self._next_seq = 0
        self._last_left: str | None = None
        self._running: dict[str, str] = {}  # admitted (charged) request_id -> key, until finish/preempt
        self._inflight: dict[str, int] = defaultdict(int)  # key -> running requests

    # -- queue -----------------------------------------------------------------------------------

    def add(self, item: T, now: float, front: bool = False) -> None:
        """Queue `item` under its key (at the head for a preempted request), lifting a newly backlogged key."""
        rid = item.request_id
        if rid in self._key_of:
            raise DuplicateItemError(f"request {rid!r} is already queued")
        key = self.key_fn(item)
        self._weights[key] = check_weight(key, item.meta.weight)  # the latest seen weight wins
        self._stop_running(rid)  # a preempted request comes back to the queue
        queue = self._queues.get(key)
        if queue is None:
            if not self._inflight.get(key):
                self._lift(key)
            queue = self._queues[key] = LazyQueue()
            self._backlog_seq[key] = self._next_seq
            self._next_seq += 1
            self._push(key)
        queue.push(item, front)
        self._key_of[rid] = key

    def remove(self, item: T) -> None:
        """Drop a queued item (cancelled, expired); no-op when absent."""
        key = self._key_of.pop(item.request_id, None)
        if key is None:
            return
        queue = self._queues[key]
        queue.discard(item)
        if not queue:
            self._leave(key)

    def peek(self, now: float) -> T | None:
        """Head of the backlogged key with the smallest counter."""
        key = self._min_key()
        return None if key is None else self._queues[key].head()

    def pop(self, item: T) -> None:
        """Remove the admitted item; charging happens in `charge` as its tokens are scheduled."""
        self.remove(item)

    def _lift(self, key: str) -> None:
        floor_key = self._min_key()
        if floor_key is None:
            floor_key = self._last_left
        if floor_key is not None and floor_key != key:
            self._counters[key] = max(self._counters[key], self._counters[floor_key])

    def _leave(self, key: str) -> None:
        del self._queues[key]
        del self._backlog_seq[key]
        self._last_left = key

    # -- heap ------------------------------------------------------------------------------------

    def _push(self, key: str) -> None:
        heapq.heappush(self._heap, (self._counters[key], self._backlog_seq[key], key))
        if len(self._heap) > 2 * len(self._backlog_seq) + _HEAP_SLACK:
            self._heap = [(self._counters[k], seq, k) for k, seq in self._backlog_seq.items()]
            heapq.heapify(self._heap)

    def _min_key(self) -> str | None:
        heap = self._heap
        while heap:
            counter, seq, key = heap[0]
            if self._backlog_seq.get(key) == seq and self._counters[key] == counter:
                return key
            heapq.heappop(heap)
        return None

    # -- accounting ------------------------------------------------------------------------------

    def charge(self, item: T, prefill: int, decode: int, cached: int) -> float:
        """Charge the item's key for tokens just scheduled; returns the (unweighted) service charged."""
        cost = self.cost(prefill, decode, cached)
        key = self.key_fn(item)
        if item.request_id not in self._running and item.request_id not in self._key_of:
            self._running[item.request_id] = key
            self._inflight[key] += 1
        self._service[key] += cost
        if cost:
            weight = self._weights.get(key)
            if weight is None:
                weight = self._weights[key] = check_weight(key, item.meta.weight)
            self._counters[key] += cost / weight
            if key in self._backlog_seq:
                self._push(key)
        return cost

    def charge_decodes(self, items: Sequence[T]) -> float:
        """One decode token for each item: the same counters as `charge` per item, bit for bit (each key's
        additions in the same order), with one heap entry per key instead of one per item."""
        cost = self.cost(0, 1, 0)
        key_fn, running, key_of, inflight = self.key_fn, self._running, self._key_of, self._inflight
        per_key: dict[str, list[T]] = {}
        for item in items:
            key = key_fn(item)
            group = per_key.get(key)
            if group is None:
                per_key[key] = group = []
            group.append(item)
            request_id = item.request_id
            if request_id not in running and request_id not in key_of:
                running[request_id] = key
                inflight[key] += 1
        for key, group in per_key.items():
            service = self._service[key]
            for _ in group:
                service += cost
            self._service[key] = service
            if cost:
                weight = self._weights.get(key)
                if weight is None:
                    weight = self._weights[key] = check_weight(key, group[0].meta.weight)
                counter, step = self._counters[key], cost / weight
                for _ in group:
                    counter += step
                self._counters[key] = counter
                if key in self._backlog_seq:
                    self._push(key)
        return cost

    def finish(self, item: T) -> None:
        """The scheduler says `item` ended: its key may become idle (and then be lifted on return)."""
        self._stop_running(item.request_id)

    def _stop_running(self, request_id: str) -> None:
        key = self._running.pop(request_id, None)
        if key is not None:
            self._inflight[key] -= 1
            if not self._inflight[key]:
                del self._inflight[key]

    def set_weight(self, key: str, weight: float) -> None:
        """Change a key's weight live (the gateway's admin API); applies to service charged from now on."""
        self._weights[key] = check_weight(key, weight)

    def victim(self, running: Sequence[T], for_item: T | None = None) -> T | None:
        """Latest arrival of the most-served key, within the least important class `for_item` may preempt."""
        candidates = lowest_class(preemptible(running, for_item))
        if not candidates:
            return None
        counters = self._counters
        return max(candidates, key=lambda r: (counters.get(self.key_fn(r), 0.0), r.meta.arrival_time))

    # -- reports ---------------------------------------------------------------------------------

    def service(self) -> Mapping[str, float]:
        """Charged (unweighted) service by fairness key."""
        return dict(self._service)

    def counters(self) -> Mapping[str, float]:
        """Virtual counters (weighted and lifted) by fairness key, for the admin dashboard."""
        return dict(self._counters)

    def weights(self) -> Mapping[str, float]:
        """Current weight by fairness key."""
        return dict(self._weights)

    def waiting(self) -> Mapping[str, int]:
        """Queued items by backlogged key."""
        return {key: len(queue) for key, queue in self._queues.items()}

    def __contains__(self, item: object) -> bool:
        return getattr(item, "request_id", None) in self._key_of

    def __len__(self) -> int:
        return len(self._key_of)
