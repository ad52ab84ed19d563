"""ModelConfig: the architecture-neutral view of a Hugging Face `config.json` for Llama-family decoders."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# HF `architectures[0]` and `model_type` values this package can run, mapped to our architecture key.
HF_ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "MistralForCausalLM": "mistral",
}
MODEL_TYPES: tuple[str, ...] = ("llama", "qwen2", "mistral")
ROPE_TYPES: tuple[str, ...] = ("default", "linear", "llama3")


@dataclass
class ModelConfig:
    """Shapes and options of one Llama-family decoder, as read from an HF `config.json`."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None  # normalised: always has "rope_type"
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # bias on q/k/v (Qwen2: always; Llama: also on o_proj)
    sliding_window: int | None = None
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    mlp_bias: bool = False

    @property
    def o_proj_bias(self) -> bool:
        """Llama puts `attention_bias` on o_proj too; Qwen2 biases only q/k/v."""
        return self.attention_bias and self.architecture == "llama"

    @classmethod
    def from_hf_config(cls, d: dict[str, Any]) -> ModelConfig:
        """Read an HF config dict; raise ValueError naming an unsupported architecture or field."""
        arch = _architecture(d)
        hidden = _int(d, "hidden_size")
        heads = _int(d, "num_attention_heads")
        kv_heads = int(d.get("num_key_value_heads") or heads)
        head_dim = int(d.get("head_dim") or 0) or hidden // heads
        if heads % kv_heads:
            raise ValueError(
                f"num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv_heads})"
            )
        act = d.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"unsupported hidden_act {act!r}: only 'silu' is implemented")
        if float(d.get("partial_rotary_factor", 1.0)) != 1.0:
            raise ValueError(
                "unsupported field partial_rotary_factor: only full rotary embeddings are implemented"
            )
        rope_theta, rope_scaling = _rope(d)
        attention_bias = bool(d.get("attention_bias", False)) or arch == "qwen2"
        return cls(
            architecture=arch,
            vocab_size=_int(d, "vocab_size"),
            hidden_size=hidden,
            intermediate_size=_int(d, "intermediate_size"),
            num_layers=_int(d, "num_hidden_layers"),
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=int(d.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            attention_bias=attention_bias,
            sliding_window=_sliding_window(d, arch),
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=eos_ids(d.get("eos_token_id")),
            mlp_bias=bool(d.get("mlp_bias", False)),
        )


def eos_ids(value: Any) -> list[int]:
    """An HF `eos_token_id` (None, an int or a list) as a list."""
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


def _int(d: dict[str, Any], key: str) -> int:
    if key not in d or not isinstance(d[key], int) or d[key] <= 0:
        raise ValueError(f"config.json: field {key!r} must be a positive integer, got {d.get(key)!r}")
    return int(d[key])


def _architecture(d: dict[str, Any]) -> str:
    archs = d.get("architectures") or []
    if archs:
        name = archs[0]
        if name not in HF_ARCHITECTURES:
            raise ValueError(f"unsupported architecture {name!r}; supported: {', '.join(HF_ARCHITECTURES)}")
        return HF_ARCHITECTURES[name]
    model_type = d.get("model_type")
    if model_type not in MODEL_TYPES:
        raise ValueError(f"unsupported model_type {model_type!r}; supported: {', '.join(MODEL_TYPES)}")
    return str(model_type)


def _rope(d: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    # transformers>=5 writes `rope_parameters`; older configs write `rope_theta` + `rope_scaling`.
    params = dict(d.get("rope_parameters") or {})
    theta = float(d.get("rope_theta") or params.get("rope_theta") or 10000.0)
    scaling = dict(d.get("rope_scaling") or params)
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"unsupported rope_scaling type {rope_type!r}; supported: {', '.join(ROPE_TYPES)}")
    if rope_type == "default":
        return theta, None
    scaling["rope_type"] = rope_type
    required = (
        ("factor",)
        if rope_type == "linear"
        else ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    )
    missing = [k for k in required if k not in scaling]
    if missing:
        raise ValueError(f"rope_scaling {rope_type!r} is missing {', '.join(missing)}")
    return theta, scaling


def _sliding_window(d: dict[str, Any], arch: str) -> int | None:
    window = d.get("sliding_window")
    if arch == "llama" or window is None:
        return None
    if arch == "qwen2":
        if not d.get("use_sliding_window", False):
            return None
        # Qwen2 slides only in layers >= max_window_layers; we run one window for the whole stack.
        num_layers = int(d.get("num_hidden_layers", 0))
        layer_types = d.get("layer_types") or [
            "sliding_attention" if i >= int(d.get("max_window_layers", 28)) else "full_attention"
            for i in range(num_layers)
        ]
        if all(t == "full_attention" for t in layer_types):
            return None
        if any(t != "sliding_attention" for t in layer_types):
            raise ValueError(
                "unsupported field use_sliding_window: Qwen2 with sliding windows on only some layers"
            )
    return int(window)
