"""Priority classes: strict order between classes (lower `meta.priority` first), a base policy within each.

Aging prevents starvation: an item that has waited `max_queue_age_s` in its class is promoted to
the next more important class, where it competes under that class's policy (it does not jump the
whole queue, so aging cannot turn VTC back into FCFS inside a class). Promotion is lazy, at `peek`,
and costs O(classes) per call plus O(1) amortised per promotion: each class keeps its items in
enqueue order, so only the heads can be due.

Charging follows the class an item was admitted in: a promoted item's tokens count against its key
in the promoted class, so promotion cannot become a free lane.
"""

from __future__ import annotations

import bisect
import math
from collections import OrderedDict, defaultdict, deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic

from fairness.base import SchedulingPolicy, T
from fairness.cost import check_weight
from fairness.errors import DuplicateItemError, FairnessError
from fairness.shared import class_counter, split_class_counter
from fairness.victim import lowest_class, preemptible

# Promoted-and-admitted items remembered for charging; bounded in case `finish` is never called.
_MAX_PROMOTED_TRACKED = 100_000


class PriorityPolicy(Generic[T]):
    """One base policy per class (made by `make_base`), strict priority between classes, aging promotion."""

    def __init__(self, make_base: Callable[[], SchedulingPolicy[T]], max_queue_age_s: float) -> None:
        if not isinstance(max_queue_age_s, (int, float)) or not max_queue_age_s > 0:
            raise FairnessError(f"max_queue_age_s must be > 0 (inf disables aging), got {max_queue_age_s!r}")
        self.make_base = make_base
        self.max_queue_age_s = float(max_queue_age_s)
        self._classes: dict[int, SchedulingPolicy[T]] = {}
        self._order: list[int] = []  # known classes, most important first
        self._class_of: dict[str, int] = {}  # queued request_id -> class it waits in
        self._entered: dict[int, deque[tuple[float, int, T]]] = {}  # per class: (entered at, token, item)
        self._token_of: dict[str, int] = {}
        self._next_token = 0
        self._admitted_in: OrderedDict[str, int] = OrderedDict()  # promoted items admitted above their class
        self._weights: dict[str, float] = {}

    def _base(self, cls: int) -> SchedulingPolicy[T]:
        base = self._classes.get(cls)
        if base is None:
            base = self._classes[cls] = self.make_base()
            for key, weight in self._weights.items():
                base.set_weight(key, weight)
            bisect.insort(self._order, cls)
            self._entered[cls] = deque()
        return base

    # -- queue -----------------------------------------------------------------------------------

    def add(self, item: T, now: float, front: bool = False) -> None:
        """Queue in the item's class; a preempted promoted item returns to the class it was admitted in."""
        rid = item.request_id
        if rid in self._class_of:
            raise DuplicateItemError(f"request {rid!r} is already queued")
        cls = self._admitted_in.pop(rid, item.meta.priority)
        self._base(cls).add(item, now, front)
        self._enter(item, cls, now)

    def _enter(self, item: T, cls: int, now: float) -> None:
        entered = self._entered[cls]
        # Clamp so each class deque stays sorted even if a caller's clock steps back.
        at = max(now, entered[-1][0]) if entered else now
        token = self._next_token
        self._next_token += 1
        self._token_of[item.request_id] = token
        self._class_of[item.request_id] = cls
        entered.append((at, token, item))

    def remove(self, item: T) -> None:
        """Drop a queued item; no-op when absent."""
        cls = self._class_of.pop(item.request_id, None)
        if cls is None:
            return
        del self._token_of[item.request_id]
        self._classes[cls].remove(item)

    def peek(self, now: float) -> T | None:
        """Promote aged items, then the first choice of the most important non-empty class."""
        self._promote(now)
        for cls in self._order:
            item = self._classes[cls].peek(now)
            if item is not None:
                return item
        return None

    def pop(self, item: T) -> None:
        """Remove the admitted item, remembering its class when aging promoted it."""
        rid = item.request_id
        cls = self._class_of.pop(rid, None)
        if cls is None:
            return
        del self._token_of[rid]
        self._classes[cls].pop(item)  # the base's own pop: it may track running requests (fairness/flows.py)
        if cls != item.meta.priority:
            self._admitted_in[rid] = cls
            if len(self._admitted_in) > _MAX_PROMOTED_TRACKED:
                self._admitted_in.popitem(last=False)

    def rank(self, item: T) -> tuple[float, ...]:
        """Class first (the one it waits in, or was admitted in), then its class's own order."""
        rid = item.request_id
        cls = self._class_of.get(rid)
        if cls is None:
            cls = self._admitted_in.get(rid, item.meta.priority)
        base = self._classes.get(cls)
        return (float(cls),) if base is None else (float(cls), *base.rank(item))

    def finish(self, item: T) -> None:
        """The scheduler says `item` is done: tell the class it ran in, forget its promotion."""
        cls = self._admitted_in.pop(item.request_id, item.meta.priority)
        base = self._classes.get(cls)
        finish = getattr(base, "finish", None)
        if finish is not None:
            finish(item)

    def _promote(self, now: float) -> None:
        if math.isinf(self.max_queue_age_s):
            return
        # Least important first, so an item overdue by several periods climbs one class per call.
        for rank in range(len(self._order) - 1, 0, -1):
            cls, target = self._order[rank], self._order[rank - 1]
            entered = self._entered[cls]
            while entered:
                at, token, item = entered[0]
                if self._token_of.get(item.request_id) != token:
                    entered.popleft()  # admitted, removed or already moved
                    continue
                if now - at < self.max_queue_age_s:
                    break
                entered.popleft()
                self._classes[cls].remove(item)
                self._base(target).add(item, now)
                self._enter(item, target, now)

    # -- accounting ------------------------------------------------------------------------------

    def charge(self, item: T, prefill: int, decode: int, cached: int) -> float:
        """Charge in the class the item was admitted in (its own class unless aging promoted it)."""
        cls = self._admitted_in.get(item.request_id, item.meta.priority)
        return self._base(cls).charge(item, prefill, decode, cached)

    def charge_decodes(self, items: Sequence[T]) -> float:
        """One decode token for each item, in the class each was admitted in (one call per class)."""
        admitted_in = self._admitted_in
        per_class: dict[int, list[T]] = {}
        for item in items:
            cls = admitted_in.get(item.request_id, item.meta.priority)
            group = per_class.get(cls)
            if group is None:
                per_class[cls] = group = []
            group.append(item)
        cost = 0.0
        for cls, group in per_class.items():
            cost = self._base(cls).charge_decodes(group)
        return cost

    def set_weight(self, key: str, weight: float) -> None:
        """Change a key's weight in every class, present and future."""
        weight = check_weight(key, weight)
        for base in self._classes.values():
            base.set_weight(key, weight)
        self._weights[key] = weight

    def weights(self) -> Mapping[str, float]:
        """Current weight by fairness key: the classes' (each key is in one class at a time), a live change
        over them."""
        merged: dict[str, float] = {}
        for base in self._classes.values():
            merged.update(getattr(base, "weights", dict)())
        return merged | self._weights

    def victim(self, running: Sequence[T], for_item: T | None = None) -> T | None:
        """The least important class present loses first; never a class more important than `for_item`'s."""
        candidates = lowest_class(preemptible(running, for_item))
        if not candidates:
            return None
        return self._base(candidates[0].meta.priority).victim(candidates)

    # -- across engines (fairness/shared.py) ----------------------------------------------------

    def local_service(self) -> Mapping[str, float]:
        """Each class's charged service here, by "<class>:<key>": a key's share is kept per class."""
        return {
            class_counter(cls, key): value
            for cls, base in self._classes.items()
            for key, value in _local_service(base).items()
        }

    def absorb_remote(self, totals: Mapping[str, float]) -> None:
        """Other engines' service by "<class>:<key>", handed to each class (made now if new here)."""
        per_class: dict[int, dict[str, float]] = defaultdict(dict)
        for name, value in totals.items():
            parsed = split_class_counter(name)
            if parsed is not None:
                per_class[parsed[0]][parsed[1]] = value
        for cls, group in per_class.items():
            absorb = getattr(self._base(cls), "absorb_remote", None)
            if absorb is not None:
                absorb(group)

    # -- reports ---------------------------------------------------------------------------------

    def service(self) -> Mapping[str, float]:
        """Charged service by fairness key, summed over classes."""
        total: dict[str, float] = defaultdict(float)
        for base in self._classes.values():
            for key, value in base.service().items():
                total[key] += value
        return dict(total)

    def counters_by_class(self) -> Mapping[int, Mapping[str, float]]:
        """Virtual counters by class, then fairness key."""
        return {cls: self._classes[cls].counters() for cls in self._order}

    def counters(self) -> Mapping[str, float]:
        """Each key's highest virtual counter across classes (the dashboard's one-number view)."""
        top: dict[str, float] = {}
        for counters in self.counters_by_class().values():
            for key, value in counters.items():
                top[key] = max(value, top.get(key, value))
        return top

    def waiting_by_class(self) -> Mapping[int, int]:
        """Queued items by class they currently wait in."""
        return {cls: len(self._classes[cls]) for cls in self._order}

    def __contains__(self, item: object) -> bool:
        return getattr(item, "request_id", None) in self._class_of

    def __len__(self) -> int:
        return len(self._class_of)


def _local_service(base: Any) -> Mapping[str, float]:
    local: Callable[[], Mapping[str, float]] | None = getattr(base, "local_service", None)
    return local() if local is not None else {}
