"""The device slots' stacked weights (engine/worker/lora/stack.py), kept as the slot cache's hooks say, and sized
to the largest rank resident so far.

Adapters arrive at run time, so the stacks' r_max cannot be fixed at start from a known set: every row
runs its shrink and expand at r_max, and padding rank-8 adapters to `max_lora_rank` (64 by default) would
multiply that work by eight. The stack therefore starts at the first adapter's rank and, when a larger
one is put, is rebuilt at that rank with every resident adapter copied in again. A rebuild makes a new
stack object: a step already built keeps the one it was built with (engine/worker/model_runner.py), so a forward
in flight never sees the copy. r_max does not shrink when the largest adapter leaves.

The stacks are allocated when adapters arrive, long after the KV cache took its share of device memory,
so the KV budget leaves room for them up front: `stack_bytes` at `max_loras` slots and `max_lora_rank`
(engine/worker/kv_budget.py). During a rebuild the old stack lives until the steps holding it end.
"""

from __future__ import annotations

import torch

from engine.worker.lora.adapter import ATTENTION_MODULES, MLP_MODULES, LoraAdapter, module_shape
from engine.worker.lora.stack import LoraStack
from engine.worker.model_config import ModelConfig


class ResidentStack:
    """`put` / `drop` for engine/worker/lora/cache.py's hooks; `stack` is None until the first adapter."""

    def __init__(self, cfg: ModelConfig, slots: int, dtype: torch.dtype, device: torch.device) -> None:
        self.cfg, self.slots, self.dtype, self.device = cfg, slots, dtype, device
        self.stack: LoraStack | None = None
        self._resident: dict[int, LoraAdapter] = {}  # slot -> the (host) adapter copied into it
        self.rebuilds = 0

    def put(self, slot: int, adapter: LoraAdapter) -> None:
        """Copy `adapter` into `slot`, growing the stacks first if its rank exceeds theirs."""
        if self.stack is not None and adapter.rank <= self.stack.max_rank:
            self.stack.put(slot, adapter)
            self._resident[slot] = adapter
            return
        self._resident[slot] = adapter
        rank = max(adapter.rank, self.stack.max_rank if self.stack is not None else 0)
        stack = LoraStack(self.cfg, self.slots, rank, self.dtype, self.device)
        try:
            for resident_slot, resident in self._resident.items():
                stack.put(resident_slot, resident)
        except Exception:  # the new adapter's copy failed: the old stack (without it) stays
            del self._resident[slot]
            raise
        self.stack = stack
        self.rebuilds += 1

    def drop(self, slot: int) -> None:
        """Empty `slot` (its weights zeroed)."""
        self._resident.pop(slot, None)
        if self.stack is not None:
            self.stack.drop(slot)


def stack_bytes(cfg: ModelConfig, slots: int, rank: int, dtype: torch.dtype) -> int:
    """Bytes of the slot stacks at r_max = `rank`: A and B of every projection an adapter may target."""
    per_rank = 0
    for layer in range(cfg.num_layers):
        targets = ATTENTION_MODULES + (() if cfg.is_sparse(layer) else MLP_MODULES)
        per_rank += sum(sum(module_shape(cfg, module)) for module in targets)
    return slots * rank * per_rank * torch.empty(0, dtype=dtype).element_size()
