# Triton kernels are a DSL: `triton.jit` is untyped and kernel arguments take Triton's own annotations.
# mypy: allow-untyped-defs, allow-incomplete-defs, allow-untyped-decorators
"""Triton SGMV (Punica-style segmented gather matmul): every adapter of a step's LoRA deltas, two launches.

Twin: `fairserve_kernels.lora_reference` (layouts there). Rows come as sorted segments, one per adapter
slot in the step; a program takes one BLOCK_M-row tile of one segment, so it reads a single slot's A
or B tile and multiplies the gathered rows by it with `tl.dot`. The grid is
(segments, ceil(max_seg_len / BLOCK_M), output blocks); a tile past its segment's end returns at once.
  shrink  h[i, :] = x[rows[i]] @ A[slot]^T, accumulated and stored in float32 (ranks padded to r_max)
  expand  out[rows[i], col_start + n] += scale[slot] * h[i] @ B[slot]^T, h rounded to B's dtype for the
          dot and the sum rounded once to out's dtype; rows in a step are distinct, so no atomics.
Rows without an adapter are in no segment: they cost nothing and are never written.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterator

import torch
import triton
import triton.language as tl

from fairserve_kernels.checks import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    KernelInputError,
    check_dtype,
    check_rank,
    check_same_device,
    check_unit_last_stride,
    is_interpreted,
)


@triton.jit
def _tile_bounds(seg_starts_ptr, BLOCK_M: tl.constexpr):
    """This program's tile of its segment (pid 0), tile pid 1: its first row and the segment's end."""
    seg = tl.program_id(0)
    first = tl.load(seg_starts_ptr + seg) + tl.program_id(1) * BLOCK_M
    return first, tl.load(seg_starts_ptr + seg + 1)


@triton.jit
def _tile_rows(rows_ptr, seg_slots_ptr, first, end, BLOCK_M: tl.constexpr):
    """The tile's slot, its positions in the segment order, which of them are real, and their token rows."""
    slot = tl.load(seg_slots_ptr + tl.program_id(0)).to(tl.int64)
    idx = first + tl.arange(0, BLOCK_M)
    valid = idx < end
    tokens = tl.load(rows_ptr + idx, mask=valid, other=0).to(tl.int64)
    return slot, idx, valid, tokens


@triton.jit
def _sgmv_shrink_kernel(
    x_ptr,
    a_ptr,
    h_ptr,
    rows_ptr,
    seg_starts_ptr,
    seg_slots_ptr,
    d_in,
    r_max,
    stride_xt,
    stride_as,
    stride_ar,
    stride_hm,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """h[i, r] = sum_k x[rows[i], k] * a[slot, r, k] for the tile (segment, pid 1) and rank block pid 2."""
    first, end = _tile_bounds(seg_starts_ptr, BLOCK_M)
    if first >= end:
        return
    slot, idx, valid, tokens = _tile_rows(rows_ptr, seg_slots_ptr, first, end, BLOCK_M)
    ranks = tl.program_id(2) * BLOCK_R + tl.arange(0, BLOCK_R)
    acc = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
    for k0 in range(0, d_in, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(
            x_ptr + tokens[:, None] * stride_xt + ks[None, :],
            mask=valid[:, None] & (ks[None, :] < d_in),
            other=0.0,
        )
        a = tl.load(
            a_ptr + slot * stride_as + ranks[None, :] * stride_ar + ks[:, None],
            mask=(ranks[None, :] < r_max) & (ks[:, None] < d_in),
            other=0.0,
        )
        acc = tl.dot(x, a.to(x.dtype), acc, input_precision=DOT_PRECISION)
    tl.store(
        h_ptr + idx.to(tl.int64)[:, None] * stride_hm + ranks[None, :],
        acc,
        mask=valid[:, None] & (ranks[None, :] < r_max),
    )


@triton.jit
def _sgmv_expand_kernel(
    h_ptr,
    b_ptr,
    out_ptr,
    scales_ptr,
    rows_ptr,
    seg_starts_ptr,
    seg_slots_ptr,
    d_out,
    r_max,
    col_start,
    stride_hm,
    stride_bs,
    stride_bn,
    stride_ot,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """out[rows[i], col_start + n] += scale[slot] * sum_r h[i, r] * b[slot, n, r] for columns block pid 2."""
    first, end = _tile_bounds(seg_starts_ptr, BLOCK_M)
    if first >= end:
        return
    slot, idx, valid, tokens = _tile_rows(rows_ptr, seg_slots_ptr, first, end, BLOCK_M)
    cols = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
    b_dtype = b_ptr.dtype.element_ty
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for r0 in range(0, r_max, BLOCK_K):
        ks = r0 + tl.arange(0, BLOCK_K)
        h = tl.load(
            h_ptr + idx.to(tl.int64)[:, None] * stride_hm + ks[None, :],
            mask=valid[:, None] & (ks[None, :] < r_max),
            other=0.0,
        )
        b = tl.load(
            b_ptr + slot * stride_bs + cols[None, :] * stride_bn + ks[:, None],
            mask=(cols[None, :] < d_out) & (ks[:, None] < r_max),
            other=0.0,
        )
        acc = tl.dot(h.to(b_dtype), b, acc, input_precision=DOT_PRECISION)
    acc = acc * tl.load(scales_ptr + slot)
    where = out_ptr + tokens[:, None] * stride_ot + col_start + cols[None, :]
    mask = valid[:, None] & (cols[None, :] < d_out)
    old = tl.load(where, mask=mask, other=0.0).to(tl.float32)
    tl.store(where, (old + acc).to(out_ptr.dtype.element_ty), mask=mask)


def _block(n: int) -> int:
    """A tile side for a dimension of n: a power of two in 16..64 (tl.dot needs 16 or more)."""
    return min(64, max(16, int(triton.next_power_of_2(n))))


def _block_m(max_seg_len: int) -> int:
    """Decode steps have segments of a few rows: a 16-row tile wastes least; prefill gets 64."""
    return 16 if max_seg_len <= 16 else 64


def _precision(dtype: torch.dtype) -> str:
    # ieee for fp32: fp32 weights stay fp32 (no TF32), as fairserve_kernels/triton_moe.py.
    return "ieee" if dtype == torch.float32 else "tf32"


def _check_segments(rows: torch.Tensor, seg_starts: torch.Tensor, seg_slots: torch.Tensor) -> None:
    for name, tensor in (("rows", rows), ("seg_starts", seg_starts), ("seg_slots", seg_slots)):
        check_rank(name, tensor, 1)
        check_dtype(name, tensor, INDEX_DTYPES)
    if seg_starts.numel() != seg_slots.numel() + 1:
        raise KernelInputError(
            f"seg_starts must have one more entry than seg_slots, got {seg_starts.numel()} and {seg_slots.numel()}"
        )


def sgmv_shrink(
    x: torch.Tensor,
    a: torch.Tensor,
    rows: torch.Tensor,
    seg_starts: torch.Tensor,
    seg_slots: torch.Tensor,
    max_seg_len: int,
) -> torch.Tensor:
    """Every segment's rows of x through its slot's A, one launch; see `lora_shrink_ref`."""
    check_rank("x", x, 2)
    check_rank("a", a, 3)
    check_dtype("x", x, FLOAT_DTYPES)
    check_dtype("a", a, FLOAT_DTYPES)
    check_unit_last_stride("x", x)
    _check_segments(rows, seg_starts, seg_slots)
    if a.shape[2] != x.shape[1] or not a.is_contiguous():
        raise KernelInputError(f"a must be a contiguous [slots, r_max, {x.shape[1]}], got {tuple(a.shape)}")
    check_same_device({"x": x, "a": a, "rows": rows}, is_interpreted(_sgmv_shrink_kernel))
    r_max = a.shape[1]
    h = torch.zeros(rows.numel(), r_max, dtype=torch.float32, device=x.device)
    if rows.numel() == 0 or seg_slots.numel() == 0:
        return h
    block_m, block_r = _block_m(max_seg_len), _block(r_max)
    grid = (seg_slots.numel(), triton.cdiv(max_seg_len, block_m), triton.cdiv(r_max, block_r))
    _sgmv_shrink_kernel[grid](
        x, a, h, rows, seg_starts, seg_slots,
        x.shape[1], r_max, x.stride(0), a.stride(0), a.stride(1), h.stride(0),
        DOT_PRECISION=_precision(x.dtype), BLOCK_M=block_m, BLOCK_R=block_r, BLOCK_K=_block(x.shape[1]),
    )  # fmt: skip
    return h


def sgmv_expand(
    out: torch.Tensor,
    h: torch.Tensor,
    b: torch.Tensor,
    scales: torch.Tensor,
    rows: torch.Tensor,
    seg_starts: torch.Tensor,
    seg_slots: torch.Tensor,
    max_seg_len: int,
    col_start: int,
) -> None:
    """Every segment's scaled h @ B[slot]^T added into out's columns from col_start, one launch; see
    `lora_expand_ref`."""
    check_rank("out", out, 2)
    check_rank("h", h, 2)
    check_rank("b", b, 3)
    check_dtype("out", out, FLOAT_DTYPES)
    check_dtype("b", b, FLOAT_DTYPES)
    check_dtype("h", h, (torch.float32,))
    check_dtype("scales", scales, (torch.float32,))
    check_unit_last_stride("out", out)
    _check_segments(rows, seg_starts, seg_slots)
    if not b.is_contiguous() or h.shape != (rows.numel(), b.shape[2]) or not h.is_contiguous():
        raise KernelInputError(
            f"b must be a contiguous [slots, d_out, r_max] and h a contiguous [rows, r_max]; "
            f"got b {tuple(b.shape)}, h {tuple(h.shape)} for {rows.numel()} rows"
        )
    if not 0 <= col_start <= out.shape[1] - b.shape[1]:
        raise KernelInputError(
            f"col_start {col_start} + d_out {b.shape[1]} exceeds out's {out.shape[1]} columns"
        )
    check_same_device({"out": out, "h": h, "b": b, "rows": rows}, is_interpreted(_sgmv_expand_kernel))
    if rows.numel() == 0 or seg_slots.numel() == 0:
        return
    d_out, r_max = b.shape[1], b.shape[2]
    block_m, block_n = _block_m(max_seg_len), 64
    grid = (seg_slots.numel(), triton.cdiv(max_seg_len, block_m), triton.cdiv(d_out, block_n))
    _sgmv_expand_kernel[grid](
        h, b, out, scales, rows, seg_starts, seg_slots,
        d_out, r_max, col_start, h.stride(0), b.stride(0), b.stride(1), out.stride(0),
        DOT_PRECISION=_precision(b.dtype), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=_block(r_max),
    )  # fmt: skip


def compile_gate_cases() -> Iterator[Callable[[], object]]:
    """Shrink and expand on "meta" tensors for every dtype, decode and prefill tiles, and ranks whose
    tiles differ (8 and 16 share a 16-wide tile, 32, 64 and over); see compile_gate.py."""
    meta = torch.device("meta")
    for dtype, rank, seg_len in itertools.product(FLOAT_DTYPES, (8, 32, 64, 128), (1, 200)):
        yield functools.partial(_gate_sgmv, dtype, rank, seg_len, meta)


def _gate_sgmv(dtype: torch.dtype, rank: int, seg_len: int, meta: torch.device) -> None:
    slots, tokens, d_in, d_out = 4, 256, 4096, 1024
    rows = torch.empty(tokens, dtype=torch.int32, device=meta)
    seg_starts = torch.empty(slots + 1, dtype=torch.int32, device=meta)
    seg_slots = torch.empty(slots, dtype=torch.int32, device=meta)
    x = torch.empty(tokens, d_in, dtype=dtype, device=meta)
    a = torch.empty(slots, rank, d_in, dtype=dtype, device=meta)
    sgmv_shrink(x, a, rows, seg_starts, seg_slots, seg_len)
    h = torch.empty(tokens, rank, dtype=torch.float32, device=meta)
    b = torch.empty(slots, d_out, rank, dtype=dtype, device=meta)
    out = torch.empty(tokens, 3 * d_out, dtype=dtype, device=meta)
    scales = torch.empty(slots, dtype=torch.float32, device=meta)
    sgmv_expand(out, h, b, scales, rows, seg_starts, seg_slots, seg_len, d_out)
