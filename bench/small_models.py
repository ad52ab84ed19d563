"""Small random-weight models (~25M parameters dense) of each architecture the engine runs, saved with
transformers for bench.engine_throughput, each with its own extras (ARCHES)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

PAD_ID = 258  # the byte tokenizer's <pad>
SMALL_GEOMETRY: dict[str, Any] = {
    "hidden_size": 512,
    "intermediate_size": 1376,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "vocab_size": 262,
    "max_position_embeddings": 2048,
}
# transformers config class and what each architecture adds to SMALL_GEOMETRY.
ARCHES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", {}),
    "qwen3": ("Qwen3Config", {}),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        {"moe_intermediate_size": 344, "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": True},
    ),
    "gemma3": (
        "Gemma3TextConfig",
        {
            "sliding_window": 128,
            "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
            "query_pre_attn_scalar": 64,
        },
    ),
}


def write_small_model(path: Path, arch: str = "llama") -> None:
    """Save the SMALL_GEOMETRY random model of `arch` (float32) with transformers, plus the byte tokenizer."""
    import transformers

    from engine.core.byte_tokenizer import write_byte_tokenizer

    config_cls, extra = ARCHES[arch]
    geometry = dict(SMALL_GEOMETRY)
    if "layer_types" in extra:
        repeats = geometry["num_hidden_layers"] // len(extra["layer_types"])
        extra = extra | {"layer_types": extra["layer_types"] * repeats}
    config = getattr(transformers, config_cls)(
        **geometry,
        **extra,
        bos_token_id=256,
        eos_token_id=257,
        pad_token_id=PAD_ID,
        tie_word_embeddings=False,
        initializer_range=0.05,
    )
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(path)
    write_byte_tokenizer(path)


def one_layer_config() -> dict[str, Any]:
    """A Llama of one layer, 32 wide, with the byte tokenizer's vocabulary (engine.loader `write_seeded_llama`
    writes it): the forward is a few small matmuls, so the host's work and the gateway's dominate. The
    fastest engine this machine runs (experiments/host_overhead.py, bench/gateway_workers.py)."""
    from engine.core.byte_tokenizer import BYTE_SPECIAL_TOKENS
    from engine.worker.loader import default_model_config

    config = default_model_config(256 + len(BYTE_SPECIAL_TOKENS))
    config.update(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
    )
    return config
