"""Two locally built models of different speed, built as the default model is (seeded random Llama, byte
tokenizer; engine/loader.py `write_seeded_llama`): `fast` is smaller than the default, `slow` larger."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.loader import default_model_config, write_seeded_llama
from engine.tokenizer import BYTE_SPECIAL_TOKENS

GEOMETRY: dict[str, dict[str, Any]] = {
    "fast": {
        "hidden_size": 64,
        "intermediate_size": 172,
        "num_hidden_layers": 1,
        "head_dim": 16,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    },
    "slow": {
        "hidden_size": 768,
        "intermediate_size": 2048,
        "num_hidden_layers": 12,
        "head_dim": 64,
        "num_attention_heads": 12,
        "num_key_value_heads": 4,
    },
}


def build_model(root: Path, name: str) -> Path:
    """Write model `name` (fast or slow) into root/name once; its directory name is its served name."""
    target = root / name
    if not (target / "model.safetensors").is_file():
        config = default_model_config(256 + len(BYTE_SPECIAL_TOKENS)) | GEOMETRY[name]
        write_seeded_llama(target, config)
    return target
