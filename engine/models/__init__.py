"""Llama-family decoders and the registry that picks one from an HF `config.json`."""

from __future__ import annotations

import torch
from torch import nn

from engine.models.config import HF_ARCHITECTURES, MODEL_TYPES, ModelConfig
from engine.models.llama import LlamaForCausalLM

# Our architecture key -> model class. Llama, Qwen2 and Mistral differ only in config-driven details
# (q/k/v bias, sliding window), so one implementation serves all three.
MODEL_REGISTRY: dict[str, type[nn.Module]] = {
    "llama": LlamaForCausalLM,
    "qwen2": LlamaForCausalLM,
    "mistral": LlamaForCausalLM,
}


def build_model(cfg: ModelConfig, dtype: torch.dtype, device: torch.device) -> nn.Module:
    """An uninitialised model for cfg; fill it with `model.load_weights(...)`."""
    if cfg.architecture not in MODEL_REGISTRY:
        raise ValueError(
            f"unsupported architecture {cfg.architecture!r}; supported: {', '.join(MODEL_REGISTRY)}"
        )
    model = MODEL_REGISTRY[cfg.architecture](cfg, dtype, torch.device(device))
    return model.eval()


__all__ = [
    "HF_ARCHITECTURES",
    "MODEL_REGISTRY",
    "MODEL_TYPES",
    "LlamaForCausalLM",
    "ModelConfig",
    "build_model",
]
