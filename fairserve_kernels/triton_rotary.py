# Triton kernels are a DSL: `triton.jit` is untyped and kernel arguments take Triton's own annotations.
# mypy: allow-untyped-defs, allow-incomplete-defs, allow-untyped-decorators
"""Triton rotary embedding: q and k heads rotated in one launch (neox / rotate-half layout).

Twin: `fairserve_kernels.layer_reference.rotary_embedding_ref` (layouts there). The models pass the q
and k heads of the merged qkv output as one strided [N, Hq + Hk, D] view, so one launch rotates both.
A program takes one token and BLOCK_H of its heads and works on the two halves of each head, the
pairs rotate-half mixes: out[:D/2] = x1*cos1 + x2*sin1 and out[D/2:] = x2*cos2 + x1*sin2, with sin
sign-folded (sin1 = -sin). Products and sum are rounded to the activation dtype where the twin rounds.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator

import torch
import triton
import triton.language as tl

from fairserve_kernels.checks import (
    FLOAT_DTYPES,
    KernelInputError,
    check_dtype,
    check_rank,
    check_same_device,
    check_unit_last_stride,
    is_interpreted,
)
from fairserve_kernels.launch_heuristics import next_power_of_2

# Narrowest half-head tile, the elements of one half a program holds (over all its heads), and the
# widest head.
MIN_BLOCK_HALF = 16
TILE_ELEMENTS = 1024
MAX_HEAD_DIM = 512


@triton.jit
def _rotary_kernel(
    x_ptr,
    cos_ptr,
    sin_ptr,
    out_ptr,
    num_heads,
    half,
    stride_xt,
    stride_xh,
    stride_ct,
    stride_st,
    stride_ot,
    stride_oh,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    """Token program_id(0), heads [program_id(1) * BLOCK_H, + BLOCK_H): rotate both halves of each head."""
    token = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    dims = tl.arange(0, BLOCK_HALF)
    dim_mask = dims < half
    mask = (heads[:, None] < num_heads) & dim_mask[None, :]
    dtype = out_ptr.dtype.element_ty
    cos1 = tl.load(cos_ptr + token * stride_ct + dims, mask=dim_mask, other=0.0).to(tl.float32)[None, :]
    cos2 = tl.load(cos_ptr + token * stride_ct + half + dims, mask=dim_mask, other=0.0).to(tl.float32)[
        None, :
    ]
    sin1 = tl.load(sin_ptr + token * stride_st + dims, mask=dim_mask, other=0.0).to(tl.float32)[None, :]
    sin2 = tl.load(sin_ptr + token * stride_st + half + dims, mask=dim_mask, other=0.0).to(tl.float32)[
        None, :
    ]
    src = x_ptr + token * stride_xt + heads[:, None].to(tl.int64) * stride_xh + dims[None, :]
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + half, mask=mask, other=0.0).to(tl.float32)
    # Each product rounded to the activation dtype, then the sum: the twin's x*cos + roll(x)*sin.
    out1 = (x1 * cos1).to(dtype).to(tl.float32) + (x2 * sin1).to(dtype).to(tl.float32)
    out2 = (x2 * cos2).to(dtype).to(tl.float32) + (x1 * sin2).to(dtype).to(tl.float32)
    dst = out_ptr + token * stride_ot + heads[:, None].to(tl.int64) * stride_oh + dims[None, :]
    tl.store(dst, out1.to(dtype), mask=mask)
    tl.store(dst + half, out2.to(dtype), mask=mask)


def tiles(head_dim: int) -> tuple[int, int]:
    """(BLOCK_H, BLOCK_HALF) for a head dimension: the half padded to a power of two, heads to fill a tile."""
    block_half = max(next_power_of_2(head_dim // 2), MIN_BLOCK_HALF)
    return max(TILE_ELEMENTS // block_half, 1), block_half


def _check(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    check_rank("x", x, 3)
    check_rank("cos", cos, 2)
    check_rank("sin", sin, 2)
    for name, tensor in (("x", x), ("cos", cos), ("sin", sin)):
        check_dtype(name, tensor, FLOAT_DTYPES)
        check_unit_last_stride(name, tensor)
    head_dim = x.shape[2]
    if head_dim % 2 or not 0 < head_dim <= MAX_HEAD_DIM:
        raise KernelInputError(f"x's head_dim must be even and at most {MAX_HEAD_DIM}, got {head_dim}")
    for name, table in (("cos", cos), ("sin", sin)):
        if table.shape != (x.shape[0], head_dim) or table.dtype != x.dtype:
            raise KernelInputError(
                f"{name} must be [{x.shape[0]}, {head_dim}] of {x.dtype}, got {tuple(table.shape)} of {table.dtype}"
            )


def rotary_embedding(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate every head of x [N, H, D] (strided heads allowed) into a new contiguous tensor; see the twin."""
    _check(x, cos, sin)
    check_same_device({"x": x, "cos": cos, "sin": sin}, is_interpreted(_rotary_kernel))
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    num_tokens, num_heads, head_dim = x.shape
    if num_tokens == 0 or num_heads == 0:
        return out
    block_h, block_half = tiles(head_dim)
    _rotary_kernel[(num_tokens, triton.cdiv(num_heads, block_h))](
        x,
        cos,
        sin,
        out,
        num_heads,
        head_dim // 2,
        x.stride(0),
        x.stride(1),
        cos.stride(0),
        sin.stride(0),
        out.stride(0),
        out.stride(1),
        BLOCK_H=block_h,
        BLOCK_HALF=block_half,
        num_warps=4,
    )
    return out


def compile_gate_cases() -> Iterator[Callable[[], object]]:
    """Launches on "meta" tensors covering every (dtype, BLOCK_H, BLOCK_HALF) `tiles` can pick.

    Head dims: 32 (BLOCK_HALF's floor), every power of two above it up to MAX_HEAD_DIM, and the padded
    ones models use (80, 96, 160, 192), each over a strided [N, Hq + Hk, D] slice of a merged qkv
    output as the models pass it.
    """
    floor = 2 * MIN_BLOCK_HALF
    powers = {floor << i for i in range((MAX_HEAD_DIM // floor).bit_length())}
    head_dims = sorted(powers | {80, 96, 160, 192})
    meta = torch.device("meta")
    for dtype in FLOAT_DTYPES:
        for head_dim in head_dims:
            qkv = torch.empty(5, 12, head_dim, dtype=dtype, device=meta)
            table = torch.empty(5, head_dim, dtype=dtype, device=meta)
            yield functools.partial(rotary_embedding, qkv[:, :10], table, table)
