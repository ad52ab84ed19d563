"""A FIFO with O(1) removal by request id: lazy deletion plus compaction once stale entries dominate."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Generic

from fairness.base import T
from fairness.errors import DuplicateItemError

# Rebuild when stale entries outnumber live ones by this slack, so memory stays O(live).
_COMPACT_SLACK = 32


class LazyQueue(Generic[T]):
    """Items in queue order; `discard` only forgets the id, stale entries are skipped at the head."""

    def __init__(self) -> None:
        self._entries: deque[tuple[int, T]] = deque()
        self._tokens: dict[str, int] = {}
        self._next_token = 0

    def push(self, item: T, front: bool = False) -> None:
        """Append `item` (or put it at the head with front=True); a queued request_id is refused."""
        rid = item.request_id
        if rid in self._tokens:
            raise DuplicateItemError(f"request {rid!r} is already queued")
        token = self._next_token
        self._next_token += 1
        self._tokens[rid] = token
        if front:
            self._entries.appendleft((token, item))
        else:
            self._entries.append((token, item))

    def discard(self, item: T) -> bool:
        """Forget `item`; True when it was queued."""
        if self._tokens.pop(item.request_id, None) is None:
            return False
        if len(self._entries) > 2 * len(self._tokens) + _COMPACT_SLACK:
            self._entries = deque(entry for entry in self._entries if self._live(entry))
        return True

    def head(self) -> T | None:
        """The first live item, dropping stale entries in front of it (amortised O(1))."""
        entries = self._entries
        while entries:
            if self._live(entries[0]):
                return entries[0][1]
            entries.popleft()
        return None

    def _live(self, entry: tuple[int, T]) -> bool:
        return self._tokens.get(entry[1].request_id) == entry[0]

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._tokens

    def __len__(self) -> int:
        return len(self._tokens)

    def __iter__(self) -> Iterator[T]:
        """Live items in queue order (O(entries); for reports and tests, not the hot path)."""
        return (item for token, item in self._entries if self._tokens.get(item.request_id) == token)
