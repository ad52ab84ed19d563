"""Virtual Token Counter (Sheng et al., OSDI 2024): serve the backlogged key with the least weighted service.

One counter per fairness key grows by `cost(tokens) / weight` as tokens are scheduled. `peek` returns
the head of the backlogged key with the smallest counter. A key that becomes backlogged (its queue goes
from empty to non-empty) is lifted, *whether or not it has requests running*:

    c_u = max(c_u, floor - allowance / w_u)

where `floor` is the smallest counter among the other backlogged keys (or, when nobody is backlogged,
the counter of the key that last left the waiting queue: it keeps growing while its admitted requests
run, so a newcomer cannot undercut it) and `allowance` is a bound in service units (`lift_allowance`).

Why both parts. Algorithm 2 of the paper lifts to `floor` exactly on every empty-to-nonempty
transition; that erases the weights of closed-loop tenants: a weight-3 tenant whose few streams are all
admitted has an empty queue, each new request of its was lifted to the weight-1 tenant's counter, and
the split came out 50/50. Lifting only fully idle keys fixed that but banked credit: a key that kept a
few short requests running (never queued, below its share) was never lifted, and when it flooded it led
the backlogged keys by 6.2x the VTC bound. With the allowance, a returning key keeps at most
`allowance` of unused service: enough for a closed-loop weighted tenant's counter to trail between its
requests (so its weight still holds), never more, so a flood leads the others by at most about
`allowance` beyond the paper's bound. The simulator tests show both (docs/fairness.md, "Lifting").
`allowance = 0` is the paper's rule.

Across engines (fairness/shared.py): a counter is the weighted service charged here, plus the lifts
applied here, plus the other engines' charged service as last heard (`absorb_remote`). Only the charged
part is published (`local_service`): a lift is this engine's correction and would be counted once per
engine if it travelled.

Backlogged keys sit in a heap of (counter, backlog order, key) with lazy invalidation: every
counter change pushes a fresh entry and `peek` drops stale tops, so add/peek/pop/charge cost
O(log K) amortised for K backlogged keys; the heap is rebuilt once stale entries dominate.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Generic

from fairness.base import Item, T
from fairness.cost import TokenCost, check_weight, item_scale
from fairness.errors import DuplicateItemError
from fairness.keys import KeyFn, tenant_key
from fairness.queue import LazyQueue
from fairness.victim import lowest_class, preemptible

_HEAP_SLACK = 64


class VTCPolicy(Generic[T]):
    """Weighted Virtual Token Counter over fairness keys; FIFO (preempted first) within a key."""

    def __init__(
        self,
        cost: TokenCost,
        key_fn: KeyFn = tenant_key,
        *,
        lift_allowance: float,
        weight_fn: Callable[[T], float] | None = None,
    ) -> None:
        if not lift_allowance >= 0 or lift_allowance == float("inf"):
            raise ValueError(f"lift_allowance must be a finite number >= 0, got {lift_allowance!r}")
        self.cost = cost
        self.lift_allowance = lift_allowance
        self.key_fn = key_fn
        # A key's weight as an item tells it (the tenant's weight by default; fairness/flows.py gives its
        # inner level the flow's weight instead).
        self.weight_fn: Callable[[T], float] = weight_fn or _meta_weight
        self._queues: dict[str, LazyQueue[T]] = {}  # backlogged keys only
        self._key_of: dict[str, str] = {}  # queued request_id -> key
        self._counters: dict[str, float] = defaultdict(float)
        self._weights: dict[str, float] = {}
        self._service: dict[str, float] = defaultdict(float)
        # The three parts of each counter (docs/fairness.md, "Across engines"): weighted service charged here
        # (the only part other engines may add), lifts (local), and other engines' charged service.
        self._charged: dict[str, float] = defaultdict(float)
        self._lifted: dict[str, float] = defaultdict(float)
        self._remote: dict[str, float] = {}
        self._heap: list[tuple[float, int, str]] = []
        self._backlog_seq: dict[str, int] = {}  # backlogged key -> when it became backlogged (tie-break)
        self._next_seq = 0
        self._last_left: str | None = None

    # -- queue -----------------------------------------------------------------------------------

    def add(self, item: T, now: float, front: bool = False) -> None:
        """Queue `item` under its key (at the head for a preempted request), lifting a newly backlogged key."""
        rid = item.request_id
        if rid in self._key_of:
            raise DuplicateItemError(f"request {rid!r} is already queued")
        key = self.key_fn(item)
        self._weights[key] = check_weight(key, self.weight_fn(item))  # the latest seen weight wins
        queue = self._queues.get(key)
        if queue is None:
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

    def next_key(self) -> str | None:
        """The backlogged key with the smallest counter (the one `peek` serves), or None."""
        return self._min_key()

    def backlogged(self, key: str) -> bool:
        """True while `key` has queued items."""
        return key in self._queues

    def forget(self, key: str) -> float:
        """Drop every trace of a key that is not backlogged; returns its charged service (for a later `resume`).

        Safe for fair share because a returning key is lifted anyway: its counter restarts at 0 and the
        lift raises it to within `lift_allowance` of the backlogged minimum (fairness/flows.py).
        """
        if key in self._queues:
            raise ValueError(f"fairness key {key!r} is backlogged and cannot be forgotten")
        for table in (self._counters, self._weights, self._service, self._lifted, self._remote):
            table.pop(key, None)
        if self._last_left == key:
            self._last_left = None
        return self._charged.pop(key, 0.0)

    def resume(self, key: str, charged: float) -> None:
        """Restore a forgotten key's published (charged) total so what other engines read never goes down."""
        self._charged[key] = max(self._charged.get(key, 0.0), charged)

    def known(self) -> int:
        """How many keys this policy holds state for."""
        return len(self._counters)

    def holds(self, key: str) -> bool:
        """True when this policy holds state for `key`."""
        return key in self._counters

    def weight(self, key: str) -> float:
        """`key`'s current weight (1 for a key never seen)."""
        return self._weights.get(key, 1.0)

    def counter(self, key: str) -> float:
        """`key`'s virtual counter (0 for a key never seen), without creating state for it."""
        return self._counters.get(key, 0.0)

    def pop(self, item: T) -> None:
        """Remove the admitted item; charging happens in `charge` as its tokens are scheduled."""
        self.remove(item)

    def rank(self, item: T) -> tuple[float, ...]:
        """The item's key's counter: the order `peek` serves keys in, for running items too."""
        return (self._counters.get(self.key_fn(item), 0.0),)

    def _lift(self, key: str) -> None:
        floor_key = self._min_key()
        if floor_key is None:
            floor_key = self._last_left
        if floor_key is not None and floor_key != key:
            floor = self._counters[floor_key] - self.lift_allowance / self._weights[key]
            if floor > self._counters[key]:
                self._lifted[key] += floor - self._counters[key]
                self._counters[key] = floor

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
        cost = self.cost(prefill, decode, cached) * item_scale(item)
        key = self.key_fn(item)
        self._service[key] += cost
        if cost:
            weight = self._weights.get(key)
            if weight is None:
                weight = self._weights[key] = check_weight(key, self.weight_fn(item))
            self._counters[key] += cost / weight
            self._charged[key] += cost / weight
            if key in self._backlog_seq:
                self._push(key)
        return cost

    def charge_decodes(self, items: Sequence[T]) -> float:
        """One decode token for each item: the same counters as `charge` per item, bit for bit (each key's
        additions in the same order), with one heap entry per key instead of one per item."""
        cost = self.cost(0, 1, 0)
        key_fn = self.key_fn
        per_key: dict[str, list[T]] = {}
        for item in items:
            key = key_fn(item)
            group = per_key.get(key)
            if group is None:
                per_key[key] = group = []
            group.append(item)
        for key, group in per_key.items():
            service = self._service[key]
            for _ in group:
                service += cost
            self._service[key] = service
            if cost:
                weight = self._weights.get(key)
                if weight is None:
                    weight = self._weights[key] = check_weight(key, self.weight_fn(group[0]))
                counter, charged, step = self._counters[key], self._charged[key], cost / weight
                for _ in group:
                    counter += step
                    charged += step
                self._counters[key], self._charged[key] = counter, charged
                if key in self._backlog_seq:
                    self._push(key)
        return cost

    def finish(self, item: T) -> None:
        """The scheduler says `item` ended. Nothing to do: the lift does not depend on running requests."""

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

    # -- across engines (fairness/shared.py) ----------------------------------------------------

    def local_service(self) -> Mapping[str, float]:
        """Weighted service charged on this engine by key: what other engines add to their counters (no lifts)."""
        return dict(self._charged)

    def absorb_remote(self, totals: Mapping[str, float]) -> None:
        """Raise each key's counter by the other engines' service charged since the last call (never lower it).

        A key absent here gets a counter too, so that when it comes back its lift starts from what it was
        served elsewhere.
        """
        for key, total in totals.items():
            gained = total - self._remote.get(key, 0.0)
            if gained > 0:
                self._remote[key] = total
                self._counters[key] += gained
                if key in self._backlog_seq:
                    self._push(key)

    def lifts(self) -> Mapping[str, float]:
        """Counter raised by lifts by key, in total (local only, never published)."""
        return dict(self._lifted)

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


def _meta_weight(item: Item) -> float:
    return item.meta.weight
