"""The rank-aware service factor of an adapter's requests (docs/fairness.md, "LoRA adapters: the charge").

Each token of an adapted request costs the base model's linear FLOPs plus, for every targeted projection,
2·r·(d_in + d_out) (x @ A^T, then that @ B^T); the factor is their ratio to the base figure, so a rank-8
adapter on a few projections costs a few percent more and a large rank on every projection much more.
Attention's context-dependent FLOPs are in neither figure.
"""

from __future__ import annotations

from engine.worker.lora.adapter import LoraAdapter, module_shape
from engine.worker.model_config import ModelConfig


def base_linear_flops(cfg: ModelConfig) -> int:
    """2 × the weights one token multiplies: every layer's projections (the active experts on a sparse
    layer, and its router) and the LM head."""
    q, kv, hidden = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.hidden_size
    attention = hidden * (q + 2 * kv) + q * hidden
    weights = hidden * cfg.vocab_size
    for layer in range(cfg.num_layers):
        if cfg.is_sparse(layer):
            mlp = hidden * cfg.num_experts + cfg.num_experts_per_tok * 3 * hidden * cfg.moe_intermediate_size
        else:
            mlp = 3 * hidden * cfg.intermediate_size
        weights += attention + mlp
    return 2 * weights


def attention_flop_ratio(cfg: ModelConfig) -> float:
    """Attention FLOPs one new token spends per cached position (QKᵀ and ·V: 4 × the query width, every
    layer) over the linear FLOPs of one token (`base_linear_flops`): `context` at a device factor of 1."""
    return 4 * cfg.num_heads * cfg.head_dim * cfg.num_layers / base_linear_flops(cfg)


def service_scale(cfg: ModelConfig, adapter: LoraAdapter) -> float:
    """1 + the adapter's extra FLOPs per token / the base model's: what each of its tokens is charged."""
    extra = sum(2 * adapter.rank * sum(module_shape(cfg, module)) for _, module in adapter.weights)
    return 1.0 + extra / base_linear_flops(cfg)
