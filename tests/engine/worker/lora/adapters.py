"""Tiny random models with random PEFT adapters, and the same models with each adapter merged in."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import peft
import torch
import transformers

from engine.core.byte_tokenizer import write_byte_tokenizer
from tests.engine.test_engine_parity import ARCHITECTURES, COMMON  # the parity tests' tiny configs, shared

CONFIGS = ARCHITECTURES  # every architecture of the model table
ALL_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ATTENTION_MODULES = ALL_MODULES[:4]  # what an adapter of a model with routed experts may target


@dataclass
class Adapted:
    """A base model directory, adapter directories by name, and each adapter merged into a model directory."""

    base: Path
    adapters: dict[str, Path]
    merged: dict[str, Path]


def build(root: Path, arch: str, specs: dict[str, tuple[int, list[str], bool]]) -> Adapted:
    """The base model of `arch`, and per name an adapter of (rank, target modules, rsLoRA), B random."""
    torch.manual_seed(7)
    config_cls, extra = CONFIGS[arch]
    cfg = getattr(transformers, config_cls)(**COMMON, **extra)
    base = root / "base"
    transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(base)
    write_byte_tokenizer(base)
    adapted = Adapted(base, {}, {})
    for i, (name, (rank, modules, rslora)) in enumerate(specs.items()):
        torch.manual_seed(100 + i)
        model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        lora = peft.LoraConfig(
            r=rank,
            lora_alpha=2 * rank,
            target_modules=modules,
            init_lora_weights=False,  # B random, not zero: the adapter changes the output
            use_rslora=rslora,
        )
        peft_model = peft.get_peft_model(model, lora)
        with torch.no_grad():  # peft's random init is far larger than the model's: keep the outputs sane
            for param in peft_model.parameters():
                if param.requires_grad:
                    param.mul_(0.3)
        adapted.adapters[name] = root / f"adapter-{name}"
        peft_model.save_pretrained(str(adapted.adapters[name]))
        adapted.merged[name] = root / f"merged-{name}"
        merged = peft_model.merge_and_unload()
        merged.save_pretrained(adapted.merged[name])  # type: ignore[operator]  # peft's return is untyped
        write_byte_tokenizer(adapted.merged[name])
    return adapted
