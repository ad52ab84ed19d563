"""The one table of architectures the engine runs, keyed by the Hugging Face `architectures` name.

A row names our architecture key, the `model_type` values that select it when a config lists no
architecture, and the module and class that implement it. Classes are imported on first use, so the
table can be read (config parsing, error messages) without importing every model.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the table is read (config parsing, errors) without torch; the classes import it
    from torch import nn


@dataclass(frozen=True)
class Architecture:
    """One supported architecture: our key, the HF model_type values that mean it, and its class."""

    key: str
    model_types: tuple[str, ...]
    module: str
    class_name: str


ARCHITECTURES: dict[str, Architecture] = {
    # Llama, Qwen2 and Mistral differ only in config-driven details (q/k/v bias, sliding window),
    # and Qwen3 only in its q/k norms: one implementation serves all four.
    "LlamaForCausalLM": Architecture("llama", ("llama",), "engine.worker.models.llama", "LlamaForCausalLM"),
    "Qwen2ForCausalLM": Architecture("qwen2", ("qwen2",), "engine.worker.models.llama", "LlamaForCausalLM"),
    "MistralForCausalLM": Architecture(
        "mistral", ("mistral",), "engine.worker.models.llama", "LlamaForCausalLM"
    ),
    "Qwen3ForCausalLM": Architecture("qwen3", ("qwen3",), "engine.worker.models.llama", "LlamaForCausalLM"),
    # The Llama decoder with a routed-expert MLP on its sparse layers.
    "Qwen3MoeForCausalLM": Architecture(
        "qwen3_moe", ("qwen3_moe",), "engine.worker.models.llama", "LlamaForCausalLM"
    ),
    "Gemma3ForCausalLM": Architecture(
        "gemma3", ("gemma3_text", "gemma3"), "engine.worker.models.gemma3", "Gemma3ForCausalLM"
    ),
}


def supported() -> str:
    """The supported HF architecture names, for error messages."""
    return ", ".join(ARCHITECTURES)


def architecture_key(hf_name: str | None, model_type: str | None) -> str:
    """Our key for an HF config's `architectures[0]` (or, without one, its `model_type`); ValueError naming
    the supported architectures otherwise."""
    if hf_name:
        if hf_name not in ARCHITECTURES:
            raise ValueError(f"unsupported architecture {hf_name!r}; supported: {supported()}")
        return ARCHITECTURES[hf_name].key
    for arch in ARCHITECTURES.values():
        if model_type in arch.model_types:
            return arch.key
    types = ", ".join(t for a in ARCHITECTURES.values() for t in a.model_types)
    raise ValueError(f"unsupported model_type {model_type!r}; supported: {types}")


def model_class(key: str) -> type[nn.Module]:
    """The module class that implements our architecture `key`."""
    for arch in ARCHITECTURES.values():
        if arch.key == key:
            cls: type[nn.Module] = getattr(importlib.import_module(arch.module), arch.class_name)
            return cls
    raise ValueError(f"unsupported architecture {key!r}; supported: {supported()}")
