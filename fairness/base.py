"""The contract between the scheduler and a fairness policy.

The policy owns the waiting queue so that choosing the next request costs O(log tenants), not
O(waiting): the scheduler asks `peek()` / `pop()` instead of sorting every iteration.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, TypeVar


class ItemMeta(Protocol):
    """What a policy may read of a request's metadata (read-only, so any dataclass with these fields fits)."""

    @property
    def tenant_id(self) -> str: ...
    @property
    def api_key_id(self) -> str | None: ...
    @property
    def user(self) -> str | None: ...
    @property
    def priority(self) -> int: ...
    @property
    def weight(self) -> float: ...
    @property
    def deadline(self) -> float | None: ...
    @property
    def arrival_time(self) -> float: ...


class Item(Protocol):
    """A schedulable request as seen by a policy."""

    @property
    def request_id(self) -> str: ...
    @property
    def meta(self) -> ItemMeta: ...


T = TypeVar("T", bound=Item)


class SchedulingPolicy(Protocol[T]):
    """Orders waiting requests, charges served tokens, and picks preemption victims."""

    def add(self, item: T, now: float, front: bool = False) -> None:
        """Queue an arrival (or, with front=True, a preempted request returning to the head of its queue)."""

    def remove(self, item: T) -> None:
        """Drop a queued item (cancelled or expired). No-op when absent."""

    def peek(self, now: float) -> T | None:
        """The item that should be admitted next, without removing it."""

    def pop(self, item: T) -> None:
        """Remove `item` (the one `peek` returned) because it was admitted."""

    def rank(self, item: T) -> tuple[float, ...]:
        """Where `item`, queued or running, stands in the order this policy serves: smaller first (VTC: its
        key's counter). The scheduler hands each step's prefill budget to running prompts and to `peek`'s
        head by it, so a running prompt does not keep the budget from a less served key (docs/fairness.md,
        "The step's budget"). Reads state only: it lifts nothing and creates no key."""

    def charge(self, item: T, prefill: int, decode: int, cached: int) -> float:
        """Charge the item's fairness key for tokens just scheduled; returns the service charged."""

    def charge_decodes(self, items: Sequence[T]) -> float:
        """`charge(item, 0, 1, 0)` for every item, in order, in one call (the scheduler's decode step charges
        a whole batch at once); returns the service charged to each item (one decode token's cost)."""

    def victim(self, running: Sequence[T], for_item: T | None = None) -> T | None:
        """Which running item to preempt so `for_item` can proceed (None: nobody may be preempted for it)."""

    def finish(self, item: T) -> None:
        """`item` ended (finished, cancelled, expired): running-request bookkeeping may drop it."""

    def set_weight(self, key: str, weight: float) -> None:
        """Change a fairness key's weight live (future charges divide by it)."""

    def counters(self) -> Mapping[str, float]:
        """The policy's ordering counters by key (VTC: virtual counters; FCFS: charged service)."""

    def service(self) -> Mapping[str, float]:
        """Charged service by fairness key so far."""

    def __len__(self) -> int:
        """Number of queued items."""

    def __contains__(self, item: object) -> bool:
        """Whether `item` is queued here."""
