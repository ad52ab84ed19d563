"""Argument checks of `paged_attention` (fairserve_kernels/triton_attention.py), run before a launch so bad input
fails with a message naming the argument instead of a wrong result or a device fault."""

from __future__ import annotations

import torch

from fairserve_kernels.checks import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    KernelInputError,
    check_dtype,
    check_rank,
    check_unit_last_stride,
)


def check_attention_args(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> None:
    """Raise KernelInputError naming the first argument `paged_attention` cannot be launched on: ranks,
    dtypes, strides, matching cache shapes, a GQA head split, head_dim <= 256, per-sequence index sizes."""
    check_rank("query", query, 3)
    check_rank("k_cache", k_cache, 4)
    check_rank("v_cache", v_cache, 4)
    check_rank("block_tables", block_tables, 2)
    check_rank("query_start_loc", query_start_loc, 1)
    check_rank("seq_lens", seq_lens, 1)
    for name, tensor in (("query", query), ("k_cache", k_cache), ("v_cache", v_cache)):
        check_dtype(name, tensor, FLOAT_DTYPES)
        check_unit_last_stride(name, tensor)
    for name, tensor in (
        ("block_tables", block_tables),
        ("query_start_loc", query_start_loc),
        ("seq_lens", seq_lens),
    ):
        check_dtype(name, tensor, INDEX_DTYPES)
    if not query_start_loc.is_contiguous() or not seq_lens.is_contiguous():
        raise KernelInputError("query_start_loc and seq_lens must be contiguous")
    if block_tables.numel() > 0 and block_tables.stride(1) != 1:
        raise KernelInputError(f"block_tables rows must be contiguous, got strides {block_tables.stride()}")
    if k_cache.shape != v_cache.shape:
        raise KernelInputError(
            f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} must match"
        )
    if query.dtype != k_cache.dtype or k_cache.dtype != v_cache.dtype:
        raise KernelInputError(
            f"query, k_cache and v_cache must share a dtype, got {query.dtype}, {k_cache.dtype}, {v_cache.dtype}"
        )
    num_heads, head_dim = query.shape[1], query.shape[2]
    num_kv_heads = k_cache.shape[2]
    if k_cache.shape[3] != head_dim:
        raise KernelInputError(f"query head_dim {head_dim} != cache head_dim {k_cache.shape[3]}")
    if num_kv_heads < 1 or num_heads % num_kv_heads:
        raise KernelInputError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    if head_dim > 256:
        raise KernelInputError(f"head_dim {head_dim} > 256 is not supported")
    num_seqs = seq_lens.shape[0]
    if query_start_loc.shape[0] != num_seqs + 1:
        raise KernelInputError(
            f"query_start_loc needs num_seqs + 1 = {num_seqs + 1} entries, got {query_start_loc.shape[0]}"
        )
    if block_tables.shape[0] < num_seqs:
        raise KernelInputError(f"block_tables has {block_tables.shape[0]} rows for {num_seqs} sequences")
    if not scale > 0:
        raise KernelInputError(f"scale must be > 0, got {scale}")
