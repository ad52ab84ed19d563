"""The persistent part of a batch's inputs: every live request's block table as a row of one preallocated array.

Rebuilding a padded [batch, blocks] table from Python lists every step cost about a microsecond per
request at batch 256 (experiments/host_overhead.py). Here a request keeps its row from admission to finish,
and a step writes only the blocks it gained since the last one (one per request every block_size
decode steps); the batch's table is then one numpy gather of the rows it runs.

A row is valid while the pool hands back the same list object for the request: the pool only appends
to a request's block list until it frees it (finish, preemption, swap-out), and a later allocation
makes a new list, which this notices by identity and rewrites the row from the start.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class BlockTableRows:
    """Slot-indexed block tables; grows (doubling) when more requests or longer tables than planned appear."""

    def __init__(self, rows: int = 64, cols: int = 16) -> None:
        self._table = np.zeros((rows, cols), dtype=np.int32)
        self._slot: dict[str, int] = {}
        self._free = list(range(rows - 1, -1, -1))
        self._source: list[list[int] | None] = [None] * rows  # the pool's list each row copies
        self._written = [0] * rows

    def rows(self, request_ids: Sequence[str], block_lists: Sequence[list[int]]) -> list[int]:
        """The row of each request, brought up to date with its block list."""
        slot_of, source, written, table = self._slot, self._source, self._written, self._table
        out = []
        for request_id, blocks in zip(request_ids, block_lists, strict=True):
            slot = slot_of.get(request_id)
            if slot is None:
                slot = self._assign(request_id)
                source, written, table = self._source, self._written, self._table
            n = len(blocks)
            if source[slot] is not blocks:  # a new allocation (or a new tenant of the row): start over
                source[slot], written[slot] = blocks, 0
                table[slot] = 0
            done = written[slot]
            if done != n:
                if n > table.shape[1]:
                    self._grow(cols=n)
                    table = self._table
                table[slot, done:n] = blocks[done:n]
                written[slot] = n
            out.append(slot)
        return out

    def gather(self, slots: list[int], width: int) -> np.ndarray:
        """The [len(slots), width] int32 block table of a batch (a copy: later writes do not change it)."""
        return self._table[slots, : max(1, width)]

    def forget(self, request_id: str) -> None:
        """The request ended: its row is free for another."""
        slot = self._slot.pop(request_id, None)
        if slot is not None:
            self._source[slot], self._written[slot] = None, 0
            self._free.append(slot)

    def _assign(self, request_id: str) -> int:
        if not self._free:
            self._grow(rows=2 * self._table.shape[0])
        slot = self._free.pop()
        self._slot[request_id] = slot
        return slot

    def _grow(self, rows: int = 0, cols: int = 0) -> None:
        old_rows, old_cols = self._table.shape
        new_rows, new_cols = max(rows, old_rows), max(old_cols, 1)
        while new_cols < cols:
            new_cols *= 2
        table = np.zeros((new_rows, new_cols), dtype=np.int32)
        table[:old_rows, :old_cols] = self._table
        self._table = table
        if new_rows > old_rows:
            self._free = list(range(new_rows - 1, old_rows - 1, -1)) + self._free
            self._source += [None] * (new_rows - old_rows)
            self._written += [0] * (new_rows - old_rows)
