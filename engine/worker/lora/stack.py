"""Every adapter's weights in device-resident stacks, one slot per adapter: what the SGMV kernels read.

Per (layer, HF module) one A stack [slots, r_max, d_in] and one B stack [slots, d_out, r_max]; an
adapter of rank r < r_max fills the first r rows of A and columns of B and leaves the rest zero, so
its delta through the padded stacks is exact. `scales[slot]` is the adapter's alpha/r (or rsLoRA)
factor, 0 for an empty slot. A module an adapter does not target stays zero in its slot: the kernels
need no per-slot module mask, and a batch row's delta is only ever read from its own slot. A module
no resident adapter targets is skipped by the forward (`get` is None).

The interface is `put(slot, adapter)` and `drop(slot)`, so whatever decides which adapters are
resident (the LRU of device slots, engine/worker/lora/cache.py, through engine/worker/lora/resident.py) only names slots.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.worker.lora.adapter import ATTENTION_MODULES, MLP_MODULES, LoraAdapter, module_shape
from engine.worker.model_config import ModelConfig


@dataclass(frozen=True)
class ModuleStack:
    """One (layer, module)'s weights of every slot: a [slots, r_max, d_in], b [slots, d_out, r_max]."""

    a: torch.Tensor
    b: torch.Tensor


class LoraStack:
    """The device slots' stacked weights; an adapter's tensors are copied in, never referenced."""

    def __init__(
        self, cfg: ModelConfig, slots: int, max_rank: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        if slots < 1 or max_rank < 1:
            raise ValueError(f"a LoRA stack needs slots >= 1 and max_rank >= 1, got {slots} and {max_rank}")
        self.slots, self.max_rank = slots, max_rank
        self.scales = torch.zeros(slots, dtype=torch.float32, device=device)
        self.modules: dict[tuple[int, str], ModuleStack] = {}
        for layer in range(cfg.num_layers):
            # Routed-expert layers have no dense MLP: adapter.py refuses adapters that target one there.
            targets = ATTENTION_MODULES + (() if cfg.is_sparse(layer) else MLP_MODULES)
            for module in targets:
                d_in, d_out = module_shape(cfg, module)
                self.modules[layer, module] = ModuleStack(
                    torch.zeros(slots, max_rank, d_in, dtype=dtype, device=device),
                    torch.zeros(slots, d_out, max_rank, dtype=dtype, device=device),
                )
        self.resident: list[str | None] = [None] * slots  # the adapter name in each slot
        self.targets: list[frozenset[tuple[int, str]]] = [frozenset()] * slots  # each slot's (layer, module)s
        self.users: dict[tuple[int, str], int] = {}  # how many resident slots target each (layer, module)

    def get(self, layer: int, module: str) -> ModuleStack | None:
        """The stacks of one projection; None where no resident adapter targets it (its delta is zero for
        every slot, so the forward skips both launches)."""
        return self.modules.get((layer, module)) if self.users.get((layer, module)) else None

    def put(self, slot: int, adapter: LoraAdapter) -> None:
        """Copy `adapter` into `slot`, replacing whatever was there (modules it does not target are zeroed)."""
        self._check_slot(slot)
        if adapter.rank > self.max_rank:
            raise ValueError(
                f"adapter {adapter.name!r}: rank {adapter.rank} exceeds the stack's {self.max_rank}"
            )
        self.drop(slot)
        self.resident[slot] = adapter.name  # (before the copies: a copy that raises is undone by `drop`)
        self.targets[slot] = frozenset(adapter.weights)
        for key in self.targets[slot]:
            self.users[key] = self.users.get(key, 0) + 1
        rank = adapter.rank
        for key, (a, b) in adapter.weights.items():
            stack = self.modules[key]
            stack.a[slot, :rank].copy_(a)
            stack.b[slot, :, :rank].copy_(b)
        self.scales[slot] = adapter.scale

    def drop(self, slot: int) -> None:
        """Empty `slot`: zero weights and scale, so a stale row indexing it adds nothing."""
        self._check_slot(slot)
        if self.resident[slot] is None:
            return
        for key in self.targets[slot]:
            self.modules[key].a[slot].zero_()
            self.modules[key].b[slot].zero_()
            self.users[key] -= 1
        self.scales[slot] = 0.0
        self.resident[slot] = None
        self.targets[slot] = frozenset()

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.slots:
            raise IndexError(f"LoRA slot {slot} is outside 0..{self.slots - 1}")
