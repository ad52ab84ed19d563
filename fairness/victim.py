"""Shared rules for choosing a preemption victim: never preempt a more important class for a lesser one."""

from __future__ import annotations

from collections.abc import Sequence

from fairness.base import T


def preemptible(running: Sequence[T], for_item: T | None) -> list[T]:
    """Candidates that may lose their memory to `for_item`: not itself, not of a more important class."""
    if for_item is None:
        return list(running)
    floor = for_item.meta.priority
    return [r for r in running if r is not for_item and r.meta.priority >= floor]


def lowest_class(candidates: Sequence[T]) -> list[T]:
    """The candidates of the least important class present (largest `meta.priority`)."""
    if not candidates:
        return []
    lowest = max(r.meta.priority for r in candidates)
    return [r for r in candidates if r.meta.priority == lowest]
