# Triton kernels are a DSL: `triton.jit` is untyped and kernel arguments take Triton's own annotations.
# mypy: allow-untyped-defs, allow-incomplete-defs, allow-untyped-decorators
"""Triton rotary embedding: q and k heads rotated in one launch (neox / rotate-half layout); and the same
rotation with the KV store folded in (`rotary_store`), the decode step's rotary and store in one launch.

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
from fairserve_kernels.triton_store import check_store_args

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


@triton.jit
def _rotary_store_kernel(
    qk_ptr,
    v_ptr,
    cos_ptr,
    sin_ptr,
    q_out_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    num_q_heads,
    num_kv_heads,
    half,
    block_size,
    rotary_programs,
    stride_qkt,
    stride_qkh,
    stride_vt,
    stride_vh,
    stride_ct,
    stride_st,
    stride_qt,
    stride_qh,
    stride_kcb,
    stride_kcs,
    stride_kch,
    stride_vcb,
    stride_vcs,
    stride_vch,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    """Token program_id(0). Programs [0, rotary_programs) of axis 1 rotate BLOCK_H of the q and k heads each:
    q heads to `q_out`, k heads into the cache at the token's slot. The others copy BLOCK_H of its v heads
    into the cache. A slot < 0 (a padding row) stores nothing in the cache."""
    token = tl.program_id(0).to(tl.int64)
    program = tl.program_id(1)
    dims = tl.arange(0, BLOCK_HALF)
    dim_mask = dims < half
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    block = slot // block_size
    offset = slot % block_size
    cached = (
        tl.zeros([BLOCK_H, BLOCK_HALF], dtype=tl.int64) + slot
    ) >= 0  # (a tile: the interpreter's masks)
    if program < rotary_programs:
        heads = program * BLOCK_H + tl.arange(0, BLOCK_H)
        mask = (heads[:, None] < num_q_heads + num_kv_heads) & dim_mask[None, :]
        dtype = q_out_ptr.dtype.element_ty
        cos_row = cos_ptr + token * stride_ct + dims
        sin_row = sin_ptr + token * stride_st + dims
        cos1 = tl.load(cos_row, mask=dim_mask, other=0.0).to(tl.float32)[None, :]
        cos2 = tl.load(cos_row + half, mask=dim_mask, other=0.0).to(tl.float32)[None, :]
        sin1 = tl.load(sin_row, mask=dim_mask, other=0.0).to(tl.float32)[None, :]
        sin2 = tl.load(sin_row + half, mask=dim_mask, other=0.0).to(tl.float32)[None, :]
        src = qk_ptr + token * stride_qkt + heads[:, None].to(tl.int64) * stride_qkh + dims[None, :]
        x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(src + half, mask=mask, other=0.0).to(tl.float32)
        # Rounded where the twin rounds, as in `_rotary_kernel`.
        out1 = ((x1 * cos1).to(dtype).to(tl.float32) + (x2 * sin1).to(dtype).to(tl.float32)).to(dtype)
        out2 = ((x2 * cos2).to(dtype).to(tl.float32) + (x1 * sin2).to(dtype).to(tl.float32)).to(dtype)
        is_q = mask & (heads[:, None] < num_q_heads)
        q_dst = q_out_ptr + token * stride_qt + heads[:, None].to(tl.int64) * stride_qh + dims[None, :]
        tl.store(q_dst, out1, mask=is_q)
        tl.store(q_dst + half, out2, mask=is_q)
        is_k = mask & (heads[:, None] >= num_q_heads) & cached
        k_heads = (heads - num_q_heads).to(tl.int64)
        k_dst = k_cache_ptr + block * stride_kcb + offset * stride_kcs + k_heads[:, None] * stride_kch
        k_dst += dims[None, :]
        k_type = k_cache_ptr.dtype.element_ty
        tl.store(k_dst, out1.to(k_type), mask=is_k)
        tl.store(k_dst + half, out2.to(k_type), mask=is_k)
    else:
        heads = (program - rotary_programs) * BLOCK_H + tl.arange(0, BLOCK_H)
        mask = (heads[:, None] < num_kv_heads) & dim_mask[None, :] & cached
        src = v_ptr + token * stride_vt + heads[:, None].to(tl.int64) * stride_vh + dims[None, :]
        dst = (
            v_cache_ptr + block * stride_vcb + offset * stride_vcs + heads[:, None].to(tl.int64) * stride_vch
        )
        dst += dims[None, :]
        v_type = v_cache_ptr.dtype.element_ty
        tl.store(dst, tl.load(src, mask=mask, other=0.0).to(v_type), mask=mask)
        tl.store(dst + half, tl.load(src + half, mask=mask, other=0.0).to(v_type), mask=mask)


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


def rotary_store(
    qk: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    num_q_heads: int,
) -> torch.Tensor:
    """Rotate q and k, store the rotated k and v in the paged cache, return the rotated q [N, Hq, D]: one
    launch where `rotary_embedding` and `store_kv` take two; see the twin `rotary_store_ref`."""
    _check(qk, cos, sin)
    num_tokens, heads, head_dim = qk.shape
    num_kv_heads = heads - num_q_heads
    check_rank("v", v, 3)
    check_unit_last_stride("v", v)
    check_dtype("v", v, FLOAT_DTYPES)
    if not 0 < num_q_heads < heads or v.shape != (num_tokens, num_kv_heads, head_dim):
        raise KernelInputError(
            f"qk holds {heads} heads of which num_q_heads={num_q_heads} are q; v must be "
            f"[{num_tokens}, {num_kv_heads}, {head_dim}], got {tuple(v.shape)}"
        )
    check_store_args(qk[:, num_q_heads:], v, k_cache, v_cache, slot_mapping)
    check_same_device(
        {"qk": qk, "v": v, "cos": cos, "sin": sin, "k_cache": k_cache, "v_cache": v_cache},
        is_interpreted(_rotary_store_kernel),
    )
    q = torch.empty(num_tokens, num_q_heads, head_dim, dtype=qk.dtype, device=qk.device)
    if num_tokens == 0:
        return q
    block_h, block_half = tiles(head_dim)
    rotary_programs = triton.cdiv(heads, block_h)
    _rotary_store_kernel[(num_tokens, rotary_programs + triton.cdiv(num_kv_heads, block_h))](
        qk,
        v,
        cos,
        sin,
        q,
        k_cache,
        v_cache,
        slot_mapping,
        num_q_heads,
        num_kv_heads,
        head_dim // 2,
        k_cache.shape[1],
        rotary_programs,
        qk.stride(0),
        qk.stride(1),
        v.stride(0),
        v.stride(1),
        cos.stride(0),
        sin.stride(0),
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        BLOCK_H=block_h,
        BLOCK_HALF=block_half,
        num_warps=4,
    )
    return q


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
            cache = torch.empty(4, 16, 2, head_dim, dtype=dtype, device=meta)
            slots = torch.empty(5, dtype=torch.int64, device=meta)
            yield functools.partial(
                rotary_store, qkv[:, :10], qkv[:, 10:], table, table, cache, cache, slots, 8
            )
