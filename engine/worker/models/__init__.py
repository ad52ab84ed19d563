"""The decoders the engine runs and `build_model`, which picks one through the registry table."""

from __future__ import annotations

import torch
from torch import nn

from engine.worker.architectures import ARCHITECTURES, model_class
from engine.worker.model_config import ModelConfig
from engine.worker.parallel.group import TPGroup


def build_model(
    cfg: ModelConfig, dtype: torch.dtype, device: torch.device, tp: TPGroup | None = None
) -> nn.Module:
    """An uninitialised model for cfg; fill it with `model.load_weights(...)`.

    tp: this rank's tensor-parallel group (engine/worker/parallel/); None builds the plain single-rank model.
    """
    model_cls = model_class(cfg.architecture)
    if tp is None:
        return model_cls(cfg, dtype, torch.device(device)).eval()
    model = model_cls(cfg, dtype, torch.device(device), tp)
    return model.eval()


__all__ = ["ARCHITECTURES", "ModelConfig", "build_model"]
