"""ModelConfig: the architecture-neutral view of a Hugging Face `config.json` for the decoders we run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.worker.architectures import architecture_key

ROPE_TYPES: tuple[str, ...] = ("default", "linear", "llama3")
ACTIVATIONS: tuple[str, ...] = ("silu", "gelu_pytorch_tanh")
SLIDING = "sliding_attention"
FULL = "full_attention"


@dataclass
class ModelConfig:
    """Shapes and options of one decoder, as read from an HF `config.json`."""

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
    # Per layer "full_attention" or "sliding_attention"; None: every layer slides when sliding_window is set.
    layer_types: list[str] | None = None
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    mlp_bias: bool = False
    hidden_act: str = "silu"
    qk_norm: bool = False  # Qwen3, Gemma 3: RMSNorm over each q and k head before RoPE
    # Gemma 3: sliding layers' own RoPE base (no scaling), sqrt(hidden) embedding scale, the attention
    # scale from query_pre_attn_scalar, and final logit soft-capping (tanh) when the config sets it.
    local_rope_theta: float | None = None
    embed_scale: float | None = None
    attn_scale: float | None = None
    attn_soft_cap: float | None = None
    final_soft_cap: float | None = None
    # Qwen3-MoE: routed experts on the layers `is_sparse` picks.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: list[int] = field(default_factory=list)

    @property
    def o_proj_bias(self) -> bool:
        """Llama, Qwen3 and Gemma 3 put `attention_bias` on o_proj too; Qwen2 biases only q/k/v."""
        return self.attention_bias and self.architecture != "qwen2"

    def window(self, layer: int) -> int | None:
        """The sliding window of `layer`, or None when it attends to the whole context."""
        if self.sliding_window is None:
            return None
        if self.layer_types is None or self.layer_types[layer] == SLIDING:
            return self.sliding_window
        return None

    def is_sparse(self, layer: int) -> bool:
        """Whether `layer` runs routed experts rather than a dense MLP (Qwen3-MoE's sparse step)."""
        return (
            self.num_experts > 0
            and layer not in self.mlp_only_layers
            and (layer + 1) % self.decoder_sparse_step == 0
        )

    @classmethod
    def from_hf_config(cls, d: dict[str, Any]) -> ModelConfig:
        """Read an HF config dict; raise ValueError naming an unsupported architecture or field."""
        archs = d.get("architectures") or []
        arch = architecture_key(archs[0] if archs else None, d.get("model_type"))
        hidden = _int(d, "hidden_size")
        heads = _int(d, "num_attention_heads")
        kv_heads = int(d.get("num_key_value_heads") or heads)
        head_dim = int(d.get("head_dim") or 0) or hidden // heads
        if heads % kv_heads:
            raise ValueError(
                f"num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv_heads})"
            )
        act = d.get("hidden_activation") or d.get("hidden_act") or "silu"
        if act not in ACTIVATIONS:
            raise ValueError(f"unsupported hidden_act {act!r}; supported: {', '.join(ACTIVATIONS)}")
        if float(d.get("partial_rotary_factor", 1.0)) != 1.0:
            raise ValueError(
                "unsupported field partial_rotary_factor: only full rotary embeddings are implemented"
            )
        rope_theta, rope_scaling = _rope(d)
        num_layers = _int(d, "num_hidden_layers")
        cfg = cls(
            architecture=arch,
            vocab_size=_int(d, "vocab_size"),
            hidden_size=hidden,
            intermediate_size=_int(d, "intermediate_size"),
            num_layers=num_layers,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=int(d.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", arch == "gemma3")),
            attention_bias=bool(d.get("attention_bias", False)) or arch == "qwen2",
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=eos_ids(d.get("eos_token_id")),
            mlp_bias=bool(d.get("mlp_bias", False)),
            hidden_act=str(act),
            qk_norm=arch in ("qwen3", "qwen3_moe", "gemma3"),
        )
        cfg.sliding_window, cfg.layer_types = _sliding_window(d, arch, num_layers)
        if arch == "qwen3_moe":
            _read_moe(cfg, d)
        if arch == "gemma3":
            _read_gemma3(cfg, d)
        return cfg


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


def _rope(d: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    # transformers>=5 writes `rope_parameters` (Gemma 3: one entry per layer type); older configs write
    # `rope_theta` + `rope_scaling`.
    params = dict(d.get("rope_parameters") or {})
    if isinstance(params.get(FULL), dict):
        params = dict(params[FULL])
    default_theta = 1_000_000.0 if _is_gemma3(d) else 10000.0
    theta = float(d.get("rope_theta") or params.get("rope_theta") or default_theta)
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


def _is_gemma3(d: dict[str, Any]) -> bool:
    return "Gemma3ForCausalLM" in (d.get("architectures") or []) or d.get("model_type") in (
        "gemma3_text",
        "gemma3",
    )


def _sliding_window(d: dict[str, Any], arch: str, num_layers: int) -> tuple[int | None, list[str] | None]:
    """(window, per-layer types): Mistral slides everywhere; Qwen2/3 in layers >= max_window_layers when
    use_sliding_window; Gemma 3 in five of every six layers (`layer_types` or `sliding_window_pattern`)."""
    window = d.get("sliding_window")
    if arch == "llama" or window is None:
        return None, None
    types = d.get("layer_types")
    if arch in ("qwen2", "qwen3", "qwen3_moe"):
        if not d.get("use_sliding_window", False):
            return None, None
        types = types or [
            SLIDING if i >= int(d.get("max_window_layers", 28)) else FULL for i in range(num_layers)
        ]
    elif arch == "gemma3":
        pattern = int(d.get("sliding_window_pattern") or d.get("_sliding_window_pattern") or 6)
        types = types or [SLIDING if (i + 1) % pattern else FULL for i in range(num_layers)]
    if types is None:
        return int(window), None
    if len(types) != num_layers or any(t not in (SLIDING, FULL) for t in types):
        raise ValueError(f"config.json: layer_types must list {FULL!r} or {SLIDING!r} for each layer")
    if all(t == FULL for t in types):
        return None, None
    return int(window), list(types)


def _read_moe(cfg: ModelConfig, d: dict[str, Any]) -> None:
    cfg.num_experts = int(d.get("num_experts") or d.get("num_local_experts") or 0)
    cfg.num_experts_per_tok = int(d.get("num_experts_per_tok") or 0)
    cfg.moe_intermediate_size = int(d.get("moe_intermediate_size") or 0)
    if cfg.num_experts <= 0 or not 0 < cfg.num_experts_per_tok <= cfg.num_experts:
        raise ValueError(
            "config.json: num_experts and num_experts_per_tok must be positive, "
            f"with num_experts_per_tok <= num_experts (got {cfg.num_experts}, {cfg.num_experts_per_tok})"
        )
    if cfg.moe_intermediate_size <= 0:
        raise ValueError("config.json: field 'moe_intermediate_size' must be a positive integer")
    cfg.norm_topk_prob = bool(d.get("norm_topk_prob", False))
    cfg.decoder_sparse_step = max(1, int(d.get("decoder_sparse_step", 1)))
    cfg.mlp_only_layers = [int(i) for i in d.get("mlp_only_layers") or []]


def _read_gemma3(cfg: ModelConfig, d: dict[str, Any]) -> None:
    params = d.get("rope_parameters") or {}
    local: dict[str, Any] = params[SLIDING] if isinstance(params.get(SLIDING), dict) else {}
    cfg.local_rope_theta = float(local.get("rope_theta") or d.get("rope_local_base_freq") or 10000.0)
    cfg.embed_scale = cfg.hidden_size**0.5
    cfg.attn_scale = float(d.get("query_pre_attn_scalar") or 256) ** -0.5
    # attn_logit_softcapping is not read: transformers' Gemma 3 never applies it (Gemma 2 did), and
    # parity with it is the contract. attn_soft_cap stays for a model that does.
    cfg.final_soft_cap = _positive_or_none(d.get("final_logit_softcapping"))


def _positive_or_none(value: Any) -> float | None:
    return float(value) if value else None
