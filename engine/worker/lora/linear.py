"""LoRA-aware projections: a model's linear with the step's adapter deltas added, as vLLM wraps its linears
(`vllm/lora/layers/*WithLoRA`) instead of threading adapters through the model code.

A model builds one `LoraProjection` per adaptable projection of a layer (the fused q/k/v, o, the fused
gate/up, down) and calls it as it would the linear. Each call reads the step's LoRA batch from the forward
context (engine/worker/forward_context.py): with no adapted row it is the linear alone; with some, the
batched delta of every module the projection fuses is added in place (engine/worker/lora/apply.py).

Not an `nn.Module`: the linear stays its owner's parameter, so weights load, shard and name as before
(`weight_targets` reads the linear itself), and a decode graph captures the plain linear (a step with
adapted rows runs eagerly).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine.worker.forward_context import step_lora
from engine.worker.kernels import Kernels
from engine.worker.lora.apply import Slices, add_lora


class LoraProjection:
    """One layer's (possibly fused, possibly row-parallel) projection, with its adapters' deltas."""

    def __init__(self, linear: Callable[[torch.Tensor], torch.Tensor], layer: int, slices: Slices) -> None:
        self.linear = linear
        self.layer = layer
        self.slices = slices  # (HF module name, first output column, width) of each module it fuses

    def __call__(self, x: torch.Tensor, ops: Kernels) -> torch.Tensor:
        """linear(x), plus the step's adapted rows' deltas (x: [N, d_in])."""
        out = self.linear(x)
        lora = step_lora()  # the step's adapted rows; None: none
        if lora is not None:
            add_lora(out, x, lora, self.layer, self.slices, ops)
        return out
