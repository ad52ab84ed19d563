"""The decoders the engine runs and `build_model`, which picks one through the registry table."""

from __future__ import annotations

import torch
from torch import nn

from engine.models.config import ModelConfig
from engine.models.registry import ARCHITECTURES, model_class


def build_model(cfg: ModelConfig, dtype: torch.dtype, device: torch.device) -> nn.Module:
    """An uninitialised model for cfg; fill it with `model.load_weights(...)`."""
    model = model_class(cfg.architecture)(cfg, dtype, torch.device(device))
    return model.eval()


__all__ = ["ARCHITECTURES", "ModelConfig", "build_model"]
