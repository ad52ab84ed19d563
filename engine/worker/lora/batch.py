"""One step's adapted token rows as sorted segments, one per adapter slot: what the SGMV kernels read.

Built on the host with the rest of the batch (engine/worker/model_runner.py), from each chunk's adapter slot
and length: `rows` lists the token rows slot by slot, `seg_starts` bounds each slot's run in it and
`seg_slots` names the slot (layouts: fairserve_kernels/lora_reference.py). Rows of requests without an
adapter are in no segment, so the projections leave them as the base model computes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from engine.worker.lora.stack import LoraStack


@dataclass(frozen=True)
class LoraSegments:
    """rows [M], seg_starts [S + 1], seg_slots [S] (int32), and the longest segment (sizes the grid)."""

    rows: torch.Tensor
    seg_starts: torch.Tensor
    seg_slots: torch.Tensor
    max_seg_len: int

    def to(self, device: torch.device) -> LoraSegments:
        return LoraSegments(
            self.rows.to(device, non_blocking=True),
            self.seg_starts.to(device, non_blocking=True),
            self.seg_slots.to(device, non_blocking=True),
            self.max_seg_len,
        )


@dataclass(frozen=True)
class LoraBatch:
    """The step's segments on the device, beside the stacked weights of every slot they name."""

    stack: LoraStack
    segments: LoraSegments


def host_groups(slots: Sequence[int | None], lengths: Sequence[int]) -> LoraSegments:
    """Segments from each chunk's slot (None: no adapter) and length; chunks of one slot are merged."""
    ends = np.cumsum(np.asarray(lengths, dtype=np.int64))
    starts = ends - np.asarray(lengths, dtype=np.int64)
    rows: dict[int, list[np.ndarray]] = {}
    for slot, start, end in zip(slots, starts.tolist(), ends.tolist(), strict=True):
        if slot is not None and end > start:
            rows.setdefault(slot, []).append(np.arange(start, end, dtype=np.int32))
    used = sorted(rows)
    runs = [np.concatenate(rows[slot]) for slot in used]
    sizes = [len(run) for run in runs]
    bounds = np.zeros(len(used) + 1, dtype=np.int32)
    np.cumsum(sizes, out=bounds[1:])
    return LoraSegments(
        torch.from_numpy(np.concatenate(runs) if runs else np.zeros(0, dtype=np.int32)),
        torch.from_numpy(bounds),
        torch.tensor(used, dtype=torch.int32),
        max(sizes, default=0),
    )


def device_batch(stack: LoraStack, segments: LoraSegments, device: torch.device) -> LoraBatch:
    """The host segments moved to the device, beside the stack they index."""
    return LoraBatch(stack, segments.to(device))
