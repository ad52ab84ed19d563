"""The flat-batch attention interface models are written against, and the backend choice."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from engine.worker.kernels import kernels

KVCache = tuple[torch.Tensor, torch.Tensor]


@dataclass
class AttentionMetadata:
    """Per-iteration batch layout shared by every layer (see fairserve_kernels/reference.py for shapes)."""

    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    max_query_len: int
    max_seq_len: int
    backend: str = "torch"
    # Sliding-window layers of a model that also has full-attention layers keep their KV in a pool of
    # their own whose blocks are freed once they fall behind the window (engine/worker/window_cache.py); this
    # is that pool's layout of the same batch. None: every layer uses the fields above.
    window_group: AttentionMetadata | None = None


def resolve_backend(name: str, device: torch.device | str) -> str:
    """`auto` picks Triton on CUDA and the torch reference elsewhere (the table: engine/worker/kernels.py)."""
    if name not in ("auto", "torch", "triton"):
        raise ValueError(f"attention_backend must be auto, torch or triton, got {name!r}")
    if name == "auto":
        return "triton" if torch.device(device).type == "cuda" else "torch"
    return name


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache: KVCache,
    meta: AttentionMetadata,
    scale: float,
    sliding_window: int | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """Store this step's K/V into the layer's paged cache, then attend over each sequence's context.

    q: [N, H, D]; k, v: [N, Hkv, D]; returns [N, H, D]. (The models store with their rotary,
    `Kernels.rotary_store`, and call `attend_stored`.)
    """
    k_cache, v_cache = kv_cache
    kernels(meta.backend).store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
    return attend_stored(q, kv_cache, meta, scale, sliding_window, **kwargs)


def attend_stored(
    q: torch.Tensor,
    kv_cache: KVCache,
    meta: AttentionMetadata,
    scale: float,
    sliding_window: int | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """Attend over each sequence's context, this step's K/V already in the layer's paged cache.

    q: [N, H, D]; returns [N, H, D].
    """
    table = kernels(meta.backend)
    k_cache, v_cache = kv_cache
    if meta.backend == "triton":
        # Host-side maxima spare the kernel wrapper a device sync per layer.
        kwargs.setdefault("max_query_len", meta.max_query_len)
        kwargs.setdefault("max_seq_len", meta.max_seq_len)
    return table.paged_attention(
        q,
        k_cache,
        v_cache,
        meta.block_tables,
        meta.query_start_loc,
        meta.seq_lens,
        scale,
        sliding_window=sliding_window,
        **kwargs,
    )
