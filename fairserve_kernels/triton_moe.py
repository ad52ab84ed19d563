# Triton kernels are a DSL: `triton.jit` is untyped and kernel arguments take Triton's own annotations.
# mypy: allow-untyped-defs, allow-incomplete-defs, allow-untyped-decorators
"""Triton fused MoE: one grouped GEMM launch per projection over every (token, expert) pair of a batch.

Twin of `fairserve_kernels.moe_reference.fused_moe_ref` (layouts there). The (token, k) pairs are sorted by
expert and each expert's run is padded to a multiple of BLOCK_M (`align_by_expert`), so every
BLOCK_M-row tile of the sorted list belongs to one expert: a program loads that expert's weight tile
and multiplies the gathered rows by it (`_grouped_gemm_kernel`). The first launch computes gate|up for
each pair, the second the down projection scaled by the routing weight; the top_k rows of a token are
summed at the end.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from fairserve_kernels.checks import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    KernelInputError,
    check_dtype,
    check_rank,
    check_same_device,
    is_interpreted,
)


@triton.jit
def _grouped_gemm_kernel(
    a_ptr,
    w_ptr,
    out_ptr,
    weights_ptr,
    sorted_pairs_ptr,
    tile_experts_ptr,
    num_pairs,
    N,
    K,
    stride_am,
    stride_we,
    stride_wn,
    stride_om,
    A_ROW_DIVISOR: tl.constexpr,
    SCALE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """out[pair] = a[pair // A_ROW_DIVISOR] @ w[expert].T (times the pair's routing weight when SCALE)."""
    tile = tl.program_id(0)
    pid_n = tl.program_id(1)
    if tl.load(sorted_pairs_ptr + tile * BLOCK_M) >= num_pairs:  # a spare tile past the used ones
        return
    expert = tl.load(tile_experts_ptr + tile)
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    pairs = tl.load(sorted_pairs_ptr + rows)
    valid = pairs < num_pairs  # padding entries hold num_pairs
    a_rows = pairs // A_ROW_DIVISOR
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(
            a_ptr + a_rows[:, None] * stride_am + ks[None, :],
            mask=valid[:, None] & (ks[None, :] < K),
            other=0.0,
        )
        w = tl.load(
            w_ptr + expert * stride_we + cols[None, :] * stride_wn + ks[:, None],
            mask=(cols[None, :] < N) & (ks[:, None] < K),
            other=0.0,
        )
        # ieee for fp32: fp32 weights stay fp32 (no TF32), so the kernel agrees with the torch path to rounding.
        acc = tl.dot(a, w.to(a.dtype), acc, input_precision=DOT_PRECISION)
    if SCALE:
        acc = acc * tl.load(weights_ptr + pairs, mask=valid, other=0.0).to(tl.float32)[:, None]
    tl.store(
        out_ptr + pairs[:, None] * stride_om + cols[None, :],
        acc.to(out_ptr.dtype.element_ty),
        mask=valid[:, None] & (cols[None, :] < N),
    )


def align_by_expert(
    topk_ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sorted pair ids padded per expert to a multiple of block_m with num_pairs, expert of each tile).

    Sized without reading anything back to the host, so a CUDA graph can capture it (engine/worker/decode_graphs.py):
    for the upper bound of tiles, ceil(pairs / block_m) + num_experts (each expert's run rounds up by less
    than a tile). Tiles past the used ones hold only padding; the kernel returns at once on them.
    """
    flat = topk_ids.reshape(-1).long()
    num_pairs = flat.numel()
    order = torch.argsort(flat, stable=True)
    # index_add_, not bincount: CUDA bincount reads the largest id back to size its output.
    counts = torch.zeros(num_experts, dtype=torch.int64, device=flat.device).index_add_(
        0, flat, torch.ones_like(flat)
    )
    tiles = (counts + block_m - 1) // block_m
    padded_starts = (torch.cumsum(tiles, 0) - tiles) * block_m
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.arange(num_pairs, device=flat.device) - starts[flat[order]]
    max_tiles = -(-num_pairs // block_m) + num_experts
    sorted_pairs = torch.full((max_tiles * block_m,), num_pairs, dtype=torch.int64, device=flat.device)
    sorted_pairs[padded_starts[flat[order]] + rank] = order
    tile = torch.arange(max_tiles, device=flat.device)
    tile_experts = torch.searchsorted(torch.cumsum(tiles, 0), tile, right=True).clamp_(max=num_experts - 1)
    return sorted_pairs, tile_experts


def _grouped_gemm(
    a: torch.Tensor,
    w: torch.Tensor,
    sorted_pairs: torch.Tensor,
    tile_experts: torch.Tensor,
    num_pairs: int,
    row_divisor: int,
    weights: torch.Tensor | None,
    block_m: int,
) -> torch.Tensor:
    n, k = w.shape[1], w.shape[2]
    out = torch.empty(num_pairs, n, dtype=a.dtype, device=a.device)
    block_n = min(64, max(16, triton.next_power_of_2(n)))
    block_k = min(64, max(16, triton.next_power_of_2(k)))
    grid = (tile_experts.numel(), triton.cdiv(n, block_n))
    _grouped_gemm_kernel[grid](
        a,
        w,
        out,
        weights if weights is not None else a,
        sorted_pairs,
        tile_experts,
        num_pairs,
        n,
        k,
        a.stride(0),
        w.stride(0),
        w.stride(1),
        out.stride(0),
        A_ROW_DIVISOR=row_divisor,
        SCALE=weights is not None,
        DOT_PRECISION="ieee"
        if a.dtype == torch.float32
        else "tf32",  # as fairserve_kernels/triton_attention.py
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
    )
    return out


def fused_moe(
    hidden: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    block_m: int = 16,
) -> torch.Tensor:
    """Routed-expert SwiGLU MLP of every token (see `fused_moe_ref`), as two grouped GEMM launches."""
    _check_moe_args(hidden, w13, w2, topk_weights, topk_ids)
    check_same_device(
        {"hidden": hidden, "w13": w13, "w2": w2, "topk_weights": topk_weights, "topk_ids": topk_ids},
        is_interpreted(_grouped_gemm_kernel),
    )
    num_tokens, top_k = topk_ids.shape
    if num_tokens == 0:
        return torch.zeros_like(hidden)
    num_pairs = num_tokens * top_k
    inter = w2.shape[2]
    hidden = hidden.contiguous()
    sorted_pairs, tile_experts = align_by_expert(topk_ids, w13.shape[0], block_m)
    gate_up = _grouped_gemm(hidden, w13, sorted_pairs, tile_experts, num_pairs, top_k, None, block_m)
    act = (F.silu(gate_up[:, :inter]) * gate_up[:, inter:]).contiguous()
    weights = topk_weights.reshape(-1).contiguous()
    down = _grouped_gemm(act, w2, sorted_pairs, tile_experts, num_pairs, 1, weights, block_m)
    return down.view(num_tokens, top_k, -1).sum(dim=1)


def _check_moe_args(
    hidden: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> None:
    for name, tensor, rank in (
        ("hidden", hidden, 2),
        ("w13", w13, 3),
        ("w2", w2, 3),
        ("topk_ids", topk_ids, 2),
    ):
        check_rank(name, tensor, rank)
    for name, tensor in (("hidden", hidden), ("w13", w13), ("w2", w2), ("topk_weights", topk_weights)):
        check_dtype(name, tensor, FLOAT_DTYPES)
    check_dtype("topk_ids", topk_ids, INDEX_DTYPES)
    experts, two_inter, size = w13.shape
    if size != hidden.shape[1] or two_inter % 2 or w2.shape != (experts, size, two_inter // 2):
        raise KernelInputError(
            f"w13 {tuple(w13.shape)} and w2 {tuple(w2.shape)} do not fit hidden {tuple(hidden.shape)}: "
            "expected w13 [E, 2I, H] and w2 [E, H, I]"
        )
    if topk_weights.shape != topk_ids.shape or topk_ids.shape[0] != hidden.shape[0]:
        raise KernelInputError(
            f"topk_weights {tuple(topk_weights.shape)} and topk_ids {tuple(topk_ids.shape)} must both be "
            f"[num_tokens={hidden.shape[0]}, top_k]"
        )
    if w13.stride(2) != 1 or w2.stride(2) != 1:
        raise KernelInputError("w13 and w2 must be contiguous in their last dimension")


def compile_gate_cases() -> Iterator[Callable[[], object]]:
    """Both grouped GEMMs of `fused_moe` on "meta" tensors; see compile_gate.py.

    `align_by_expert` sizes its output from the routing (a host sync), so the cases call the launcher
    behind it, `_grouped_gemm`, with each projection's shape: gate|up [E, 2I, H] then down [E, H, I].
    Hidden and expert sizes cover small test models up to Qwen3-MoE's (2048, 768) and beyond.
    """
    for dtype, hidden, inter, block_m in itertools.product(
        (torch.bfloat16, torch.float16, torch.float32), (64, 1024, 2048, 4096), (32, 768, 1536), (16,)
    ):
        yield functools.partial(_gate_moe, dtype, hidden, inter, block_m)


def _gate_moe(dtype: torch.dtype, hidden: int, inter: int, block_m: int) -> None:
    meta = torch.device("meta")
    experts, pairs, tiles = 8, 64, 16
    sorted_pairs = torch.empty(tiles * block_m, dtype=torch.int64, device=meta)
    tile_experts = torch.empty(tiles, dtype=torch.int64, device=meta)
    weights = torch.empty(pairs, dtype=dtype, device=meta)
    a = torch.empty(pairs, hidden, dtype=dtype, device=meta)
    w13 = torch.empty(experts, 2 * inter, hidden, dtype=dtype, device=meta)
    _grouped_gemm(a, w13, sorted_pairs, tile_experts, pairs, 2, None, block_m)
    act = torch.empty(pairs, inter, dtype=dtype, device=meta)
    w2 = torch.empty(experts, hidden, inter, dtype=dtype, device=meta)
    _grouped_gemm(act, w2, sorted_pairs, tile_experts, pairs, 1, weights, block_m)
