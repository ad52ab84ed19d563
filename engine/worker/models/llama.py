"""Llama-family decoder (Llama, Qwen2, Mistral, Qwen3, Qwen3-MoE) over a flat token batch and a paged KV cache.

Tokens of every sequence in the batch are laid end to end (no padding); `positions` says where
each token sits in its own sequence, and `AttentionMetadata` says which cache slots it reads and
writes. q/k/v and gate/up projections are merged into one GEMM each (one weight, the HF q/k/v and
gate/up tensors concatenated at load: `weight_targets` maps each HF name onto its rows); the residual
stream travels beside the hidden states so each norm is fused with the add before it, and norms,
rotary and the gated activation run through the backend's kernels (engine/worker/kernels.py). Config-driven
options: q/k/v bias, per-layer sliding windows, Qwen3's q/k norms, Qwen3-MoE's routed experts on its
sparse layers.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from engine.worker.attention import AttentionMetadata, KVCache, attend_stored
from engine.worker.kernels import Kernels, kernels
from engine.worker.layers import (
    RMSNorm,
    SourceSlice,
    Target,
    WeightTargets,
    gated_activation,
    linear,
    linear_targets,
    norm_class,
    rope_inv_freq,
    rope_tables,
)
from engine.worker.lora.apply import Slices
from engine.worker.lora.linear import LoraProjection
from engine.worker.model_config import ModelConfig
from engine.worker.models.moe import SparseMoeBlock
from engine.worker.parallel.group import HeadShard, TPGroup, even_split, head_shard
from engine.worker.parallel.layers import ParallelLMHead, RowParallelLinear, VocabParallelEmbedding


def row_linear(
    n_in: int, n_out: int, bias: bool, dtype: torch.dtype, device: torch.device, tp: TPGroup | None
) -> nn.Linear | RowParallelLinear:
    """o_proj and down_proj: a plain linear on one rank, row-parallel (summed over the ranks) on several."""
    if tp is None:
        return linear(n_in, n_out, bias, dtype, device)
    return RowParallelLinear(n_in, n_out, bias, dtype, device, tp)


def rows_of(tp: TPGroup | None, dim: int, start: int, length: int) -> SourceSlice | None:
    """This rank's slice of a checkpoint tensor (None on one rank: all of it)."""
    return None if tp is None else SourceSlice(dim, start, length)


class LlamaAttention(nn.Module):
    """Grouped-query self-attention with fused qkv, optional q/k norms, RoPE and the paged attention call."""

    def __init__(
        self,
        cfg: ModelConfig,
        layer_idx: int,
        dtype: torch.dtype,
        device: torch.device,
        tp: TPGroup | None = None,
    ) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.tp = tp
        # Tensor parallelism: this rank's q heads and the KV heads they read (all of them on one rank).
        self.shard = (
            head_shard(cfg.num_heads, cfg.num_kv_heads, tp.rank, tp.world)
            if tp is not None
            else HeadShard(cfg.num_heads, 0, cfg.num_kv_heads, 0)
        )
        self.num_heads, self.num_kv_heads = self.shard.q_heads, self.shard.kv_heads
        self.head_dim = cfg.head_dim
        self.q_size = self.num_heads * cfg.head_dim
        self.kv_size = self.num_kv_heads * cfg.head_dim
        self.scale = cfg.attn_scale or cfg.head_dim**-0.5
        self.sliding_window = cfg.window(layer_idx)
        self.soft_cap = cfg.attn_soft_cap
        self.qkv_proj = linear(
            cfg.hidden_size, self.q_size + 2 * self.kv_size, cfg.attention_bias, dtype, device
        )
        self.o_proj = row_linear(
            cfg.num_heads * cfg.head_dim, cfg.hidden_size, cfg.o_proj_bias, dtype, device, tp
        )
        norm = norm_class(cfg)
        # LoRA-aware projections (engine/worker/lora/linear.py): where an adapter's q/k/v deltas land in the
        # fused output, and o's.
        qkv_slices: Slices = (
            ("q_proj", 0, self.q_size),
            ("k_proj", self.q_size, self.kv_size),
            ("v_proj", self.q_size + self.kv_size, self.kv_size),
        )
        self.qkv = LoraProjection(self.qkv_proj, layer_idx, qkv_slices)
        self.o = LoraProjection(self.o_proj, layer_idx, (("o_proj", 0, cfg.hidden_size),))
        self.q_norm = norm(cfg.head_dim, cfg.rms_norm_eps, dtype, device) if cfg.qk_norm else None
        self.k_norm = norm(cfg.head_dim, cfg.rms_norm_eps, dtype, device) if cfg.qk_norm else None

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: KVCache,
        meta: AttentionMetadata,
        ops: Kernels,
    ) -> torch.Tensor:
        """x: [N, hidden]; cos/sin: [N, head_dim] in x's dtype (sin sign-folded, see layers.rope_tables)."""
        heads = self.num_heads + self.num_kv_heads
        qkv = self.qkv(x, ops).view(-1, heads + self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            qk = torch.cat(
                (
                    self.q_norm(qkv[:, : self.num_heads], ops),
                    self.k_norm(qkv[:, self.num_heads : heads], ops),
                ),
                1,
            )
        else:
            qk = qkv[:, :heads]
        if self.sliding_window is not None and meta.window_group is not None:
            meta = (
                meta.window_group
            )  # this layer's KV lives in the window-sized pool (engine/worker/window_cache.py)
        # q and k heads are adjacent: one launch rotates both and stores k and v in the paged cache.
        k_cache, v_cache = kv_cache
        v = qkv[:, heads:]
        q = ops.rotary_store(qk, v, cos, sin, k_cache, v_cache, meta.slot_mapping, self.num_heads)
        out = attend_stored(
            q, kv_cache, meta, scale=self.scale, sliding_window=self.sliding_window, soft_cap=self.soft_cap
        )
        return self.o(out.reshape(-1, self.q_size), ops)

    def weight_targets(self, prefix: str) -> WeightTargets:
        """HF q/k/v/o projections (and q/k norms) onto the fused parameters."""
        q, kv, tp = self.q_size, self.kv_size, self.tp
        q_rows = rows_of(tp, 0, self.shard.q_start * self.head_dim, q)
        kv_rows = rows_of(tp, 0, self.shard.kv_start * self.head_dim, kv)
        targets = linear_targets(f"{prefix}.q_proj", self.qkv_proj, 0, q, q_rows)
        targets |= linear_targets(f"{prefix}.k_proj", self.qkv_proj, q, kv, kv_rows)
        targets |= linear_targets(f"{prefix}.v_proj", self.qkv_proj, q + kv, kv, kv_rows)
        o_cols = rows_of(tp, 1, self.shard.q_start * self.head_dim, q)
        targets |= linear_targets(f"{prefix}.o_proj", self.o_proj, 0, self.o_proj.out_features, o_cols)
        if self.q_norm is not None and self.k_norm is not None:
            targets[f"{prefix}.q_norm.weight"] = Target(self.q_norm.weight, 0, self.head_dim)
            targets[f"{prefix}.k_norm.weight"] = Target(self.k_norm.weight, 0, self.head_dim)
        return targets


class LlamaMLP(nn.Module):
    """Gated feed-forward (SwiGLU, or GELU-tanh for Gemma): one gate/up GEMM, one act-and-mul, down."""

    def __init__(
        self,
        cfg: ModelConfig,
        layer_idx: int,
        dtype: torch.dtype,
        device: torch.device,
        tp: TPGroup | None = None,
    ) -> None:
        super().__init__()
        self.tp = tp
        # Tensor parallelism: gate/up column-parallel over this rank's intermediate rows, down row-parallel.
        self.inter_start, self.intermediate_size = (
            even_split(cfg.intermediate_size, tp.rank, tp.world, "intermediate_size")
            if tp is not None
            else (0, cfg.intermediate_size)
        )
        self.act = gated_activation(cfg.hidden_act)
        self.gate_up_proj = linear(cfg.hidden_size, 2 * self.intermediate_size, cfg.mlp_bias, dtype, device)
        self.down_proj = row_linear(cfg.intermediate_size, cfg.hidden_size, cfg.mlp_bias, dtype, device, tp)
        inter = self.intermediate_size  # LoRA-aware projections (engine/worker/lora/linear.py)
        gate_up = (("gate_proj", 0, inter), ("up_proj", inter, inter))
        self.gate_up = LoraProjection(self.gate_up_proj, layer_idx, gate_up)
        self.down = LoraProjection(self.down_proj, layer_idx, (("down_proj", 0, cfg.hidden_size),))

    def forward(self, x: torch.Tensor, ops: Kernels) -> torch.Tensor:
        """down(act(gate(x)) * up(x)), with the step's adapters' deltas."""
        return self.down(ops.act_and_mul(self.gate_up(x, ops), self.act), ops)

    def weight_targets(self, prefix: str) -> WeightTargets:
        """HF gate/up/down projections onto the fused parameters."""
        inter, tp = self.intermediate_size, self.tp
        rows, cols = rows_of(tp, 0, self.inter_start, inter), rows_of(tp, 1, self.inter_start, inter)
        targets = linear_targets(f"{prefix}.gate_proj", self.gate_up_proj, 0, inter, rows)
        targets |= linear_targets(f"{prefix}.up_proj", self.gate_up_proj, inter, inter, rows)
        down = self.down_proj
        return targets | linear_targets(f"{prefix}.down_proj", down, 0, down.out_features, cols)


class LlamaDecoderLayer(nn.Module):
    """Pre-norm attention and MLP (dense or routed experts) blocks, each with a residual connection.

    The residual stream is carried apart from the block outputs (as in vLLM): a layer returns its MLP
    output and the stream without adding them, and the next norm adds them in the same kernel.
    """

    def __init__(
        self,
        cfg: ModelConfig,
        layer_idx: int,
        dtype: torch.dtype,
        device: torch.device,
        tp: TPGroup | None = None,
    ) -> None:
        super().__init__()
        norm = norm_class(cfg)
        self.hidden_size = cfg.hidden_size
        self.input_layernorm = norm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        self.self_attn = LlamaAttention(cfg, layer_idx, dtype, device, tp)
        self.post_attention_layernorm = norm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        self.mlp: LlamaMLP | SparseMoeBlock = (
            SparseMoeBlock(cfg, dtype, device, tp)
            if cfg.is_sparse(layer_idx)
            else LlamaMLP(cfg, layer_idx, dtype, device, tp)
        )

    def forward(
        self,
        h: torch.Tensor,
        residual: torch.Tensor | None,
        rope: tuple[torch.Tensor, torch.Tensor],
        kv_cache: KVCache,
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One block over the flat batch: (the block's output, the residual stream it has not been added to).

        residual None: h is the embedding itself (the first layer).
        """
        ops = kernels(meta.backend)
        x, residual = self.input_norm(h, residual, ops)
        x = self.self_attn(x, *rope, kv_cache, meta, ops)
        x, residual = self.post_attention_layernorm.add(x, residual, ops)
        mlp: torch.Tensor = self.mlp(x, ops)  # (routed experts are never adapted)
        return mlp, residual

    def input_norm(
        self, h: torch.Tensor, residual: torch.Tensor | None, ops: Kernels
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The first norm of the block, with the previous block's output added to the stream first."""
        if residual is None:
            return self.input_layernorm(h, ops), h
        return self.input_layernorm.add(h, residual, ops)

    def weight_targets(self, prefix: str) -> WeightTargets:
        """This layer's HF tensor names onto its parameters."""
        targets = self.self_attn.weight_targets(f"{prefix}.self_attn") | self.mlp.weight_targets(
            f"{prefix}.mlp"
        )
        for name in ("input_layernorm", "post_attention_layernorm"):
            targets[f"{prefix}.{name}.weight"] = Target(getattr(self, name).weight, 0, self.hidden_size)
        return targets


class LlamaForCausalLM(nn.Module):
    """The whole decoder: embeddings, layers, final norm and LM head, over a flat batch."""

    rope_cos: torch.Tensor
    rope_sin: torch.Tensor
    layer_class: type[LlamaDecoderLayer] = LlamaDecoderLayer

    def __init__(
        self, cfg: ModelConfig, dtype: torch.dtype, device: torch.device, tp: TPGroup | None = None
    ) -> None:
        super().__init__()
        self.config = cfg
        self.dtype = dtype
        self.tp = tp
        self.embed_tokens: nn.Embedding | VocabParallelEmbedding
        self.lm_head: nn.Linear | ParallelLMHead
        if tp is None:
            # An uninitialised weight (the loader fills it) handed in directly, not skip_init: see layers.linear.
            self.embed_tokens = nn.Embedding(
                cfg.vocab_size,
                cfg.hidden_size,
                _weight=torch.empty(cfg.vocab_size, cfg.hidden_size, dtype=dtype, device=device),
            )
        else:  # vocab-parallel: each rank holds ceil(vocab_size / world) rows of it and of the LM head
            self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, dtype, device, tp)
        self.layers = nn.ModuleList(
            self.layer_class(cfg, i, dtype, device, tp) for i in range(cfg.num_layers)
        )
        self.norm: RMSNorm = norm_class(cfg)(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        if tp is None:
            self.lm_head = linear(cfg.hidden_size, cfg.vocab_size, False, dtype, device)
        else:
            self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size, dtype, device, tp)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        inv_freq = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
        cos, sin = rope_tables(inv_freq, cfg.max_position_embeddings, device, dtype)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

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
        rope = (self.rope_cos[positions].to(h.dtype), self.rope_sin[positions].to(h.dtype))
        residual: torch.Tensor | None = None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            h, residual = layer(h, residual, rope, kv_cache, attn_meta)
        return self.final_norm(h, residual, attn_meta)

    def final_norm(
        self, h: torch.Tensor, residual: torch.Tensor | None, meta: AttentionMetadata
    ) -> torch.Tensor:
        """The last block's output added to the stream, normed (a model with no layers norms h itself)."""
        ops = kernels(meta.backend)
        if residual is None:
            alone: torch.Tensor = self.norm(h, ops)
            return alone
        normed, _ = self.norm.add(h, residual, ops)
        return normed

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Project selected hidden rows [M, hidden] to vocabulary logits [M, vocab] in float32."""
        return self.raw_logits(hidden).float()

    def raw_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """`compute_logits` before the float32 cast (the model dtype): a decode graph copies them into its
        float32 buffer, the cast and the copy one kernel (engine/worker/decode_graphs.py)."""
        logits: torch.Tensor = self.lm_head(hidden)
        return logits

    @torch.no_grad()
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy HF-named checkpoint tensors into the (fused) parameters; raise on missing/mis-shaped ones."""
        targets = self.weight_targets()
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
            param, start, size, source = targets[name]
            if source is not None and tensor.shape[source.dim] != source.length:
                tensor = tensor.narrow(*source)  # a whole tensor: this rank's slice of it
            expected = (size, *param.shape[1:])
            if tuple(tensor.shape) != expected:
                raise ValueError(
                    f"checkpoint tensor {name!r} has shape {tuple(tensor.shape)}, expected {expected}"
                )
            param[start : start + size].copy_(tensor)
            loaded.add(name)
        missing = sorted(set(targets) - loaded)
        if missing:
            more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
            raise ValueError(f"checkpoint is missing tensors: {', '.join(missing[:5])}{more}")

    def weight_targets(self) -> WeightTargets:
        """HF tensor name -> (our parameter, first row, number of rows) it fills."""
        cfg = self.config
        embed = self.embed_tokens
        start, vocab_rows = 0, cfg.vocab_size  # all of the vocabulary on one rank
        if isinstance(embed, VocabParallelEmbedding):  # this rank's real rows (the padding is not loaded)
            start, vocab_rows = embed.start, embed.real_rows
        vocab = rows_of(self.tp, 0, start, vocab_rows)
        targets: WeightTargets = {
            "model.embed_tokens.weight": Target(self.embed_tokens.weight, 0, vocab_rows, vocab),
            "model.norm.weight": Target(self.norm.weight, 0, cfg.hidden_size),
        }
        if not cfg.tie_word_embeddings:
            targets["lm_head.weight"] = Target(self.lm_head.weight, 0, vocab_rows, vocab)
        for i, layer in enumerate(self.layers):
            assert isinstance(layer, LlamaDecoderLayer)
            targets |= layer.weight_targets(f"model.layers.{i}")
        return targets
