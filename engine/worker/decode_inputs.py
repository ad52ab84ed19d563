"""The persistent inputs every captured decode graph reads (engine/worker/decode_graphs.py), and how a step's
host-built batch reaches them: one packed, pinned, non-blocking upload, spread on the device."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from engine.worker.attention import AttentionMetadata

if TYPE_CHECKING:
    from engine.worker.host_batch import HostBatch


class DecodeInputs:
    """The persistent inputs and output every captured graph reads and writes (rows beyond a step's
    bucket are never read). A padding row stores at slot -1 (nowhere), has seq_len 0 (the kernels'
    padding row: it attends to nothing and reads no block) and its logits are discarded."""

    def __init__(
        self, max_batch: int, table_width: int, vocab_size: int, windowed: bool, device: torch.device
    ) -> None:
        def index(fill: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
            return torch.full((max_batch,), fill, dtype=dtype, device=device)

        self.ids, self.positions, self.slots = index(0), index(0), index(-1)
        self.seq_lens = index(0, torch.int32)
        self.query_start_loc = torch.arange(max_batch + 1, dtype=torch.int32, device=device)
        self.table = torch.zeros((max_batch, table_width), dtype=torch.int32, device=device)
        self.window_slots = index(-1) if windowed else None
        self.window_table = torch.zeros_like(self.table) if windowed else None
        self.logits = torch.zeros((max_batch, vocab_size), dtype=torch.float32, device=device)
        # One step's host values, packed: ids, positions, slots and lengths (the window's slots too), then
        # the block tables (`fill`).
        tables = 2 if windowed else 1
        self.staging = torch.zeros(max_batch * (5 + tables * table_width), dtype=torch.int64, device=device)

    def meta(self, size: int, max_seq_len: int, backend: str) -> AttentionMetadata:
        """The attention metadata of bucket `size`: views of the buffers, fixed for its graph's life."""
        meta = AttentionMetadata(
            slot_mapping=self.slots[:size],
            block_tables=self.table[:size],
            query_start_loc=self.query_start_loc[: size + 1],
            seq_lens=self.seq_lens[:size],
            max_query_len=1,
            max_seq_len=max_seq_len,
            backend=backend,
        )
        if self.window_slots is not None and self.window_table is not None:
            meta.window_group = replace(
                meta, slot_mapping=self.window_slots[:size], block_tables=self.window_table[:size]
            )
        return meta

    def fits(self, batch: HostBatch) -> bool:
        """Whether the batch's block tables fit the buffers' width (else the step runs eagerly)."""
        width = self.table.shape[1]
        window = batch.window_table
        return batch.table.shape[1] <= width and (window is None or window.shape[1] <= width)

    def fill(self, batch: HostBatch, size: int, ids: torch.Tensor | None, prev: torch.Tensor | None) -> None:
        """Copy a decode batch into rows [0, n) and pad rows [n, size). The host's values (ids, positions,
        slots, lengths, block tables) are packed into one int64 tensor and uploaded in one copy (pinned
        and non-blocking on CUDA), then spread into the static buffers on the device. `ids`: the batch's
        ids already on the device (a tensor-parallel rank's, from rank 0), else taken from the host batch,
        its in-flight placeholders (async scheduling) filled from `prev`, the previous step's samples."""
        rows, width = batch.table.shape
        flat: list[tuple[torch.Tensor, torch.Tensor, int]] = [
            (self.positions, batch.positions, 0),
            (self.slots, batch.slots, -1),
            (self.seq_lens, batch.seq_lens, 0),
        ]
        tables = [(self.table, batch.table)]
        if self.window_slots is not None and self.window_table is not None:
            if batch.window_slots is None or batch.window_table is None:
                raise RuntimeError("a windowed model's decode batch without its window layout")
            flat.append((self.window_slots, batch.window_slots, -1))
            tables.append((self.window_table, batch.window_table))
        if ids is None:
            flat.append((self.ids, batch.ids, 0))
        pieces = [_padded(values, size, pad) for _, values, pad in flat]
        pieces += [table.reshape(-1).to(torch.int64) for _, table in tables]
        packed = torch.cat(pieces)
        staged = self.staging[: packed.shape[0]]
        _upload(staged, packed)
        at = 0
        for buffer, _, _ in flat:
            buffer[:size].copy_(staged[at : at + size])
            at += size
        for buffer, table in tables:
            rows, width = table.shape
            buffer[:rows, :width].copy_(staged[at : at + rows * width].view(rows, width))
            at += rows * width
        if ids is not None:
            self.ids[: ids.shape[0]].copy_(ids)
            self.ids[ids.shape[0] : size].fill_(0)
        elif batch.placeholders:
            if prev is None or not len(prev):
                raise RuntimeError("a placeholder token without the previous step's samples")
            live = self.ids[:size]
            live.copy_(torch.where(live < 0, prev[(-live - 1).clamp(0, len(prev) - 1)], live))


def _padded(values: torch.Tensor, size: int, pad: int) -> torch.Tensor:
    """`values` (host) as int64, padded with `pad` to `size` rows."""
    values = values.to(torch.int64)
    n = values.shape[0]
    return values if n >= size else torch.cat((values, values.new_full((size - n,), pad)))


def _upload(buffer: torch.Tensor, values: torch.Tensor) -> None:
    """Copy host values into a device buffer without waiting for the device: from pageable memory a copy
    waits for everything queued before it (the previous step's forward), from pinned memory it is queued
    behind it. The caching host allocator keeps the pinned block until the copy has run."""
    if buffer.is_cuda and values.device.type == "cpu":
        buffer.copy_(values.pin_memory(), non_blocking=True)
    else:
        buffer.copy_(values)
