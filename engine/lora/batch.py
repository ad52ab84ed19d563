"""One step's token rows grouped by adapter: what each adapted projection of the forward reads.

Built on the host with the rest of the batch (engine/model_runner.py), from each chunk's device slot
(engine/lora/cache.py) and length; rows of requests without an adapter are in no group, so the projections leave them as
the base model computes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from engine.lora.adapter import LoraAdapter


@dataclass
class LoraBatch:
    """(adapter, its rows on the device) for every adapter the step uses."""

    groups: list[tuple[LoraAdapter, torch.Tensor]]


def host_groups(slots: Sequence[int | None], lengths: Sequence[int]) -> list[tuple[int, torch.Tensor]]:
    """(slot, token rows) per adapter slot present, from each chunk's slot (None: none) and length."""
    ends = np.cumsum(np.asarray(lengths, dtype=np.int64))
    starts = ends - np.asarray(lengths, dtype=np.int64)
    rows: dict[int, list[np.ndarray]] = {}
    for slot, start, end in zip(slots, starts.tolist(), ends.tolist(), strict=True):
        if slot is not None:
            rows.setdefault(slot, []).append(np.arange(start, end, dtype=np.int64))
    return [(slot, torch.from_numpy(np.concatenate(parts))) for slot, parts in sorted(rows.items())]


def device_batch(groups: Sequence[tuple[LoraAdapter, torch.Tensor]], device: torch.device) -> LoraBatch:
    """The host groups' rows moved to the device, each beside its adapter."""
    return LoraBatch([(adapter, rows.to(device)) for adapter, rows in groups])
