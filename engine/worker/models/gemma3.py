"""Gemma 3 text decoder: the Llama decoder with Gemma's differences, over the same flat batch and paged cache.

- sliding-window and global layers interleave (`ModelConfig.layer_types`), each kind with its own
  RoPE base (`local_rope_theta` for the sliding ones, unscaled);
- embeddings are scaled by sqrt(hidden); norms are (1 + w) RMSNorms; q/k heads are normed before
  RoPE; the attention scale is query_pre_attn_scalar ** -0.5, with tanh soft-capping when configured;
- each block is sandwiched: a norm before and after attention, and before and after the GELU-tanh MLP.
"""

from __future__ import annotations

import torch

from engine.worker.attention import AttentionMetadata, KVCache
from engine.worker.kernels import kernels
from engine.worker.layers import RMSNorm, Target, WeightTargets, norm_class, rope_inv_freq, rope_tables
from engine.worker.model_config import ModelConfig
from engine.worker.models.llama import LlamaDecoderLayer, LlamaForCausalLM
from engine.worker.parallel.group import TPGroup


class Gemma3DecoderLayer(LlamaDecoderLayer):
    """Pre- and post-norms around both attention and MLP."""

    def __init__(
        self,
        cfg: ModelConfig,
        layer_idx: int,
        dtype: torch.dtype,
        device: torch.device,
        tp: TPGroup | None = None,
    ) -> None:
        super().__init__(cfg, layer_idx, dtype, device, tp)
        norm = norm_class(cfg)
        self.pre_feedforward_layernorm: RMSNorm = norm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        self.post_feedforward_layernorm: RMSNorm = norm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        self.sliding = cfg.window(layer_idx) is not None

    def forward(
        self,
        h: torch.Tensor,
        residual: torch.Tensor | None,
        rope: tuple[torch.Tensor, torch.Tensor],
        kv_cache: KVCache,
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One sandwich-normed block; rope is this layer kind's (local or global) cos/sin.

        The post-norms stay plain norms; the stream is added in the pre-norms after them (pre-feedforward
        here, the next layer's input norm, or the final norm), each in one fused add+norm.
        """
        ops = kernels(meta.backend)
        x, residual = self.input_norm(h, residual, ops)
        x = self.post_attention_layernorm(self.self_attn(x, *rope, kv_cache, meta, ops), ops)
        x, residual = self.pre_feedforward_layernorm.add(x, residual, ops)
        out = self.post_feedforward_layernorm(self.mlp(x, ops), ops)
        return out, residual

    def weight_targets(self, prefix: str) -> WeightTargets:
        """The Llama layer's names plus the two feed-forward norms."""
        targets = super().weight_targets(prefix)
        for name in ("pre_feedforward_layernorm", "post_feedforward_layernorm"):
            targets[f"{prefix}.{name}.weight"] = Target(getattr(self, name).weight, 0, self.hidden_size)
        return targets


class Gemma3ForCausalLM(LlamaForCausalLM):
    """Scaled embeddings, two RoPE tables (global and local), optional final logit soft-capping."""

    local_cos: torch.Tensor
    local_sin: torch.Tensor
    layer_class = Gemma3DecoderLayer

    def __init__(
        self, cfg: ModelConfig, dtype: torch.dtype, device: torch.device, tp: TPGroup | None = None
    ) -> None:
        super().__init__(cfg, dtype, device, tp)
        local = rope_inv_freq(cfg.head_dim, cfg.local_rope_theta or cfg.rope_theta, None)
        cos, sin = rope_tables(local, cfg.max_position_embeddings, device, dtype)
        self.register_buffer("local_cos", cos, persistent=False)
        self.register_buffer("local_sin", sin, persistent=False)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[KVCache],
        attn_meta: AttentionMetadata,
    ) -> torch.Tensor:
        """input_ids, positions: [N]; returns final hidden [N, hidden]."""
        if len(kv_caches) != len(self.layers):
            raise ValueError(f"expected {len(self.layers)} KV caches, got {len(kv_caches)}")
        h = self.embed_tokens(input_ids)
        # HF multiplies by sqrt(hidden) rounded to the model dtype.
        h = h * torch.tensor(self.config.embed_scale or 1.0, dtype=h.dtype)
        ropes = {
            False: (self.rope_cos[positions].to(h.dtype), self.rope_sin[positions].to(h.dtype)),
            True: (self.local_cos[positions].to(h.dtype), self.local_sin[positions].to(h.dtype)),
        }
        residual: torch.Tensor | None = None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            assert isinstance(layer, Gemma3DecoderLayer)
            h, residual = layer(h, residual, ropes[layer.sliding], kv_cache, attn_meta)
        return self.final_norm(h, residual, attn_meta)

    def raw_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The float32 logits: the soft cap is applied in float32, after the cast (as HF does)."""
        return self.compute_logits(hidden)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Vocabulary logits in float32, soft-capped when final_logit_softcapping is set."""
        logits = self.lm_head(hidden).float()
        cap = self.config.final_soft_cap
        return logits if cap is None else torch.tanh(logits / cap) * cap
