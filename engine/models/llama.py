"""Llama-family decoder (Llama, Qwen2, Mistral) over a flat token batch and a paged KV cache.

Tokens of every sequence in the batch are laid end to end (no padding); `positions` says where
each token sits in its own sequence, and `AttentionMetadata` says which cache slots it reads and
writes. q/k/v and gate/up projections are fused into one matmul each; `load_weights` maps the
Hugging Face checkpoint names onto the fused shards.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention import AttentionMetadata, KVCache, paged_attention
from engine.models.config import ModelConfig


class RMSNorm(nn.Module):
    """Root-mean-square norm computed in float32, weight applied in the model dtype (as HF does)."""

    def __init__(self, size: int, eps: float, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(size, dtype=dtype, device=device))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise the last dimension of x."""
        if x.dtype == torch.float32:
            return F.rms_norm(
                x, self.weight.shape, self.weight, self.eps
            )  # one fused kernel, same math in fp32
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """Inverse frequencies of the rotary embedding, with linear or llama3 scaling applied."""
    dim = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = cfg.rope_scaling
    if scaling is None:
        return inv_freq
    factor = float(scaling["factor"])
    if scaling["rope_type"] == "linear":
        return inv_freq / factor
    # llama3: keep high frequencies, divide low ones by `factor`, interpolate in between.
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    old_len = float(scaling["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_len / high) & ~(wavelen > old_len / low)
    return torch.where(medium, smoothed, scaled)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """HF's rotary convention (halves of the head dimension pair up): x*cos + rotate_half(x)*sin.

    `signed_sin` carries rotate_half's minus sign on its first half, so the rotation is one roll.
    """
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin


class LlamaAttention(nn.Module):
    """Grouped-query self-attention with fused qkv, RoPE and the paged attention call."""

    def __init__(self, cfg: ModelConfig, layer_idx: int, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.scale = cfg.head_dim**-0.5
        self.sliding_window = cfg.sliding_window
        self.qkv_proj = _linear(
            cfg.hidden_size, self.q_size + 2 * self.kv_size, cfg.attention_bias, dtype, device
        )
        self.o_proj = _linear(self.q_size, cfg.hidden_size, cfg.o_proj_bias, dtype, device)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: KVCache,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """x: [N, hidden]; cos/sin: [N, 1, head_dim] in x's dtype (sin sign-folded, see apply_rope)."""
        heads = self.num_heads + self.num_kv_heads
        qkv = self.qkv_proj(x).view(-1, heads + self.num_kv_heads, self.head_dim)
        # q and k heads are adjacent in the fused projection: rotate them in one pass.
        qk = apply_rope(qkv[:, :heads], cos, sin)
        q, k, v = qk[:, : self.num_heads], qk[:, self.num_heads :], qkv[:, heads:]
        out = paged_attention(q, k, v, kv_cache, meta, scale=self.scale, sliding_window=self.sliding_window)
        projected: torch.Tensor = self.o_proj(out.reshape(-1, self.q_size))
        return projected


class LlamaMLP(nn.Module):
    """SwiGLU feed-forward with fused gate/up projection."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.intermediate_size = cfg.intermediate_size
        self.gate_up_proj = _linear(cfg.hidden_size, 2 * cfg.intermediate_size, cfg.mlp_bias, dtype, device)
        self.down_proj = _linear(cfg.intermediate_size, cfg.hidden_size, cfg.mlp_bias, dtype, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """down(silu(gate(x)) * up(x))."""
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)
        down: torch.Tensor = self.down_proj(F.silu(gate) * up)
        return down


class LlamaDecoderLayer(nn.Module):
    """Pre-norm attention and MLP blocks, each with a residual connection."""

    def __init__(self, cfg: ModelConfig, layer_idx: int, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        self.self_attn = LlamaAttention(cfg, layer_idx, dtype, device)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        self.mlp = LlamaMLP(cfg, dtype, device)

    def forward(
        self,
        h: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: KVCache,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """One transformer block over the flat batch."""
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, kv_cache, meta)
        mlp: torch.Tensor = self.mlp(self.post_attention_layernorm(h))
        return h + mlp


class LlamaForCausalLM(nn.Module):
    """The whole decoder: embeddings, layers, final norm and LM head, over a flat batch."""

    rope_cos: torch.Tensor
    rope_sin: torch.Tensor

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.config = cfg
        self.dtype = dtype
        # An uninitialised weight (the loader fills it) handed in directly, not skip_init: see _linear.
        self.embed_tokens = nn.Embedding(
            cfg.vocab_size,
            cfg.hidden_size,
            _weight=torch.empty(cfg.vocab_size, cfg.hidden_size, dtype=dtype, device=device),
        )
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg, i, dtype, device) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        self.lm_head = _linear(cfg.hidden_size, cfg.vocab_size, False, dtype, device)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        # cos/sin for every position in float32, cast to the model dtype per forward like HF does;
        # sin carries rotate_half's sign on its first half (see apply_rope).
        inv_freq = rope_inv_freq(cfg)
        freqs = torch.outer(torch.arange(cfg.max_position_embeddings).float(), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("rope_cos", emb.cos().to(device), persistent=False)
        half = emb.shape[-1] // 2
        sign = torch.cat((-torch.ones(half), torch.ones(emb.shape[-1] - half)))
        self.register_buffer("rope_sin", (emb.sin() * sign).to(device), persistent=False)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[KVCache],
        attn_meta: AttentionMetadata,
    ) -> torch.Tensor:
        """input_ids, positions: [N] (positions < max_position_embeddings); returns final hidden [N, hidden]."""
        if len(kv_caches) != len(self.layers):
            raise ValueError(f"expected {len(self.layers)} KV caches, got {len(kv_caches)}")
        h = self.embed_tokens(input_ids)
        cos = self.rope_cos[positions].to(h.dtype).unsqueeze(1)
        sin = self.rope_sin[positions].to(h.dtype).unsqueeze(1)
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            h = layer(h, cos, sin, kv_cache, attn_meta)
        normed: torch.Tensor = self.norm(h)
        return normed

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Project selected hidden rows [M, hidden] to vocabulary logits [M, vocab] in float32."""
        logits: torch.Tensor = self.lm_head(hidden)
        return logits.float()

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy HF-named checkpoint tensors into the (fused) parameters; raise on missing/mis-shaped ones."""
        targets = self._weight_targets()
        loaded: set[str] = set()
        for name, tensor in named_tensors:
            if name.endswith("rotary_emb.inv_freq"):
                continue  # old checkpoints store the RoPE buffer; we compute it
            if name == "lm_head.weight" and self.config.tie_word_embeddings:
                continue  # tied: the head is the embedding matrix
            if name not in targets:
                raise ValueError(
                    f"unexpected checkpoint tensor {name!r} for a {self.config.architecture} model"
                )
            param, start, size = targets[name]
            expected = (size, *param.shape[1:])
            if tuple(tensor.shape) != expected:
                raise ValueError(
                    f"checkpoint tensor {name!r} has shape {tuple(tensor.shape)}, expected {expected}"
                )
            with torch.no_grad():
                param[start : start + size].copy_(tensor)
            loaded.add(name)
        missing = sorted(set(targets) - loaded)
        if missing:
            more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
            raise ValueError(f"checkpoint is missing tensors: {', '.join(missing[:5])}{more}")

    def _weight_targets(self) -> dict[str, tuple[torch.Tensor, int, int]]:
        """HF tensor name -> (our parameter, first row, number of rows) it fills."""
        cfg = self.config
        targets: dict[str, tuple[torch.Tensor, int, int]] = {
            "model.embed_tokens.weight": (self.embed_tokens.weight, 0, cfg.vocab_size),
            "model.norm.weight": (self.norm.weight, 0, cfg.hidden_size),
        }
        if not cfg.tie_word_embeddings:
            targets["lm_head.weight"] = (self.lm_head.weight, 0, cfg.vocab_size)
        for i, layer in enumerate(self.layers):
            assert isinstance(layer, LlamaDecoderLayer)
            p = f"model.layers.{i}."
            attn, mlp = layer.self_attn, layer.mlp
            q, kv = attn.q_size, attn.kv_size
            suffixes = ("weight", "bias") if cfg.attention_bias else ("weight",)
            for suffix in suffixes:
                fused = getattr(attn.qkv_proj, suffix)
                targets[f"{p}self_attn.q_proj.{suffix}"] = (fused, 0, q)
                targets[f"{p}self_attn.k_proj.{suffix}"] = (fused, q, kv)
                targets[f"{p}self_attn.v_proj.{suffix}"] = (fused, q + kv, kv)
            for suffix in ("weight", "bias") if cfg.o_proj_bias else ("weight",):
                targets[f"{p}self_attn.o_proj.{suffix}"] = (getattr(attn.o_proj, suffix), 0, cfg.hidden_size)
            inter = cfg.intermediate_size
            for suffix in ("weight", "bias") if cfg.mlp_bias else ("weight",):
                targets[f"{p}mlp.gate_proj.{suffix}"] = (getattr(mlp.gate_up_proj, suffix), 0, inter)
                targets[f"{p}mlp.up_proj.{suffix}"] = (getattr(mlp.gate_up_proj, suffix), inter, inter)
                targets[f"{p}mlp.down_proj.{suffix}"] = (getattr(mlp.down_proj, suffix), 0, cfg.hidden_size)
            targets[f"{p}input_layernorm.weight"] = (layer.input_layernorm.weight, 0, cfg.hidden_size)
            targets[f"{p}post_attention_layernorm.weight"] = (
                layer.post_attention_layernorm.weight,
                0,
                cfg.hidden_size,
            )
        return targets


class _UninitialisedLinear(nn.Linear):
    """nn.Linear whose parameters are allocated but not initialised: load_weights fills every one of them.

    Not torch.nn.utils.skip_init: that runs the random init on the meta device, through torch's Python
    reference implementations, which cost about a second of every engine worker start (docs/engine.md).
    """

    def reset_parameters(self) -> None:
        """Nothing: the weights come from the checkpoint or the seeded default model."""


def _linear(n_in: int, n_out: int, bias: bool, dtype: torch.dtype, device: torch.device) -> nn.Linear:
    return _UninitialisedLinear(n_in, n_out, bias=bias, dtype=dtype, device=device)
