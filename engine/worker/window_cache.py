"""The KV blocks of a model's sliding-window layers, freed as they fall behind the window.

A model that mixes sliding-window and full-attention layers (Gemma 3: five sliding layers to one
global) keeps its full layers' KV in the engine's BlockPool and its sliding layers' KV here: a pool
of its own, with a per-request table in which every logical block wholly behind the window points
at the null block (block 0, never written, read only under the window mask) and its physical block
is back on the free list. So a request holds at most ceil((window - 1 + chunk) / block_size) + 1
sliding blocks, however long it runs, while the full layers' memory grows with the context.

A request left out of a step is trimmed to the window behind its last position, so the running
requests together hold at most `pool_blocks` (sized from the scheduler's limits, which keep that many
free for the sliding layers). Should a batch still need more, the pool grows (doubling): correct when
steps run one after another; under async scheduling a forward may still be writing the old tensors,
which is why the bound sizes the pool up front. Prefix caching cannot reuse these blocks (a hit would
need the sliding layers' KV of the window before it), so the engine uses this pool only when prefix
caching is off; with it on, sliding layers keep their KV in the BlockPool like every other layer.
"""

from __future__ import annotations

import torch

KVCache = tuple[torch.Tensor, torch.Tensor]
NULL_BLOCK = 0


def pool_blocks(window: int, block_size: int, max_num_seqs: int, max_num_batched_tokens: int) -> int:
    """Blocks the running requests can hold at once: each the window behind its chunk (plus a partial block
    at either end), the chunks together at most the token budget, and the null block."""
    per_seat = -(-(window - 1) // block_size) + 2
    return max_num_seqs * per_seat + -(-max_num_batched_tokens // block_size) + 1


class WindowBlocks:
    """Per-request tables and the KV tensors of the sliding-window layer group."""

    def __init__(
        self,
        window: int,
        block_size: int,
        num_layers: int,
        kv_shape: tuple[int, int],
        dtype: torch.dtype,
        device: torch.device,
        initial_blocks: int,
    ) -> None:
        self.window, self.block_size = window, block_size
        self._num_layers, self._kv_shape, self._dtype, self._device = num_layers, kv_shape, dtype, device
        self.caches: list[KVCache] = [
            (self._empty(initial_blocks), self._empty(initial_blocks)) for _ in range(num_layers)
        ]
        self._free = list(range(initial_blocks - 1, NULL_BLOCK, -1))  # popped from the end: low ids first
        self.tables: dict[str, list[int]] = {}
        self._ends: dict[str, int] = {}  # one past each request's last claimed position
        self.peak_used = 0

    @property
    def num_blocks(self) -> int:
        """Blocks the pool holds (used, free and the null block)."""
        return int(self.caches[0][0].shape[0]) if self.caches else 0

    @property
    def num_used(self) -> int:
        """Blocks some request's window still sees."""
        return self.num_blocks - 1 - len(self._free)

    def claim(self, request_id: str, start: int, end: int) -> list[int]:
        """The request's table for a chunk of positions [start, end): blocks behind the window of `start`
        freed, blocks up to `end` allocated. A chunk from position 0 starts the request afresh."""
        table = self.tables.setdefault(request_id, [])
        if start == 0 and table:
            self.release(request_id)
            table = self.tables.setdefault(request_id, [])
        first_live = self._free_behind(table, start)
        self._ends[request_id] = end
        need = -(-end // self.block_size)
        while len(table) < need:
            table.append(NULL_BLOCK if len(table) < first_live else self._take())
        self.peak_used = max(self.peak_used, self.num_used)
        return table

    def trim_idle(self, scheduled: set[str]) -> None:
        """Free, for each request not in this step, the blocks behind the window of its next position."""
        for request_id, table in self.tables.items():
            if request_id not in scheduled:
                self._free_behind(table, self._ends.get(request_id, 0))

    def _free_behind(self, table: list[int], position: int) -> int:
        """Free the blocks wholly behind the window of a query at `position`; the first live logical block."""
        first_live = max(0, position - self.window + 1) // self.block_size
        for i in range(min(first_live, len(table))):
            if table[i] != NULL_BLOCK:
                self._free.append(table[i])
                table[i] = NULL_BLOCK
        return first_live

    def release(self, request_id: str) -> None:
        """Free every block of the request (finished, or preempted for recompute)."""
        self._ends.pop(request_id, None)
        for block in self.tables.pop(request_id, []):
            if block != NULL_BLOCK:
                self._free.append(block)

    def save(self, request_id: str) -> tuple[list[int], list[KVCache]]:
        """Copy the request's live blocks to host memory and free them (swap preemption): (which logical
        blocks were live, their K/V per layer)."""
        table = self.tables.get(request_id, [])
        live = [i for i, block in enumerate(table) if block != NULL_BLOCK]
        ids = torch.tensor([table[i] for i in live], dtype=torch.long, device=self._device)
        saved = [(k[ids].to("cpu", copy=True), v[ids].to("cpu", copy=True)) for k, v in self.caches]
        self.release(request_id)
        return live, saved

    def restore(self, request_id: str, live: list[int], saved: list[KVCache]) -> None:
        """Put blocks `save` took back under fresh physical blocks."""
        end = self._ends.get(request_id, 0)
        self.release(request_id)
        self._ends[request_id] = end
        table = [NULL_BLOCK] * (max(live) + 1 if live else 0)
        for i in live:
            table[i] = self._take()
        self.tables[request_id] = table
        ids = torch.tensor([table[i] for i in live], dtype=torch.long, device=self._device)
        for (k, v), (sk, sv) in zip(self.caches, saved, strict=True):
            k[ids] = sk.to(self._device)
            v[ids] = sv.to(self._device)

    def _take(self) -> int:
        if not self._free:
            self._grow()
        return self._free.pop()

    def _grow(self) -> None:
        old = self.num_blocks
        self.caches = [
            (torch.cat((k, self._empty(old).to(k.dtype))), torch.cat((v, self._empty(old).to(v.dtype))))
            for k, v in self.caches
        ]
        self._free = list(range(2 * old - 1, old - 1, -1)) + self._free

    def _empty(self, blocks: int) -> torch.Tensor:
        shape = (blocks, self.block_size, *self._kv_shape)
        return torch.zeros(shape, dtype=self._dtype, device=self._device)
