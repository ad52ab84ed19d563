"""What the engine calls on a model besides its forward: logits for chosen rows and weight loading."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import torch


class CausalLM(Protocol):
    """Every class in `MODEL_REGISTRY` has these two methods; `nn.Module`'s type cannot say so."""

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Selected hidden rows [M, hidden] to float32 logits [M, vocab]."""
        ...

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy HF-named checkpoint tensors into the parameters."""
        ...
