"""What the engine calls on a model besides its forward: logits for chosen rows and weight loading."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import torch

from engine.worker.layers import WeightTargets


class CausalLM(Protocol):
    """Every class in `MODEL_REGISTRY` has these methods; `nn.Module`'s type cannot say so."""

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Selected hidden rows [M, hidden] to float32 logits [M, vocab]."""
        ...

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy HF-named checkpoint tensors into the parameters."""
        ...

    def weight_targets(self) -> WeightTargets:
        """HF tensor name -> the parameter rows it fills (and, under tensor parallelism, the slice read)."""
        ...
