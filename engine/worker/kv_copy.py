"""Copy on write on the device: KV blocks a request shared (n > 1's partial prompt block) copied into the
fresh blocks the scheduler gave it, before the step's forward writes into them (engine/core/kv_cache.py
`copy_on_write`, engine/core/scheduler.py `_claim`).

One indexed copy per layer and tensor for all of a step's pairs, on the stream the forward then runs on,
so the copy reads the shared block after the previous step's forward wrote it (async scheduling builds
the next step meanwhile, but runs it after) and before anything writes either block. Every tensor-parallel
rank copies its own shard, told in the step's message (engine/worker/rank_steps.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.worker.attention import KVCache


def copy_blocks(
    kv_caches: Sequence[KVCache],
    layers: Sequence[int],
    pairs: Sequence[tuple[int, int]],
    device: torch.device,
) -> None:
    """For each (shared, fresh) pair, fresh's K and V become shared's in each of `layers` (those the BlockPool
    backs: sliding-window layers keep their KV elsewhere)."""
    if not pairs:
        return
    src = torch.tensor([shared for shared, _ in pairs], dtype=torch.long, device=device)
    dst = torch.tensor([fresh for _, fresh in pairs], dtype=torch.long, device=device)
    for layer in layers:
        for cache in kv_caches[layer]:
            cache.index_copy_(0, dst, cache.index_select(0, src))
