# Triton kernels are a DSL: `triton.jit` is untyped and kernel arguments take Triton's own annotations.
# mypy: allow-untyped-defs, allow-incomplete-defs, allow-untyped-decorators
"""Triton RMSNorm, alone or fused with the residual add before it: one launch where torch needs five.

Twins: `fairserve_kernels.layer_reference.rms_norm_ref` and `fused_add_rms_norm_ref` (layouts there).
One program normalises one row (a token's hidden state, or one head of q/k for Qwen3's and Gemma 3's
q/k norms, so rows may be strided views of the merged qkv output). The whole row sits in registers
(BLOCK = the row width rounded up to a power of two), so x is read once and the statistics and the
scaling happen without a second pass.
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
    check_same_device,
    check_unit_last_stride,
    is_interpreted,
)
from fairserve_kernels.launch_heuristics import next_power_of_2

# The narrowest tile (rows narrower than this are masked) and the widest row one program holds.
MIN_BLOCK = 64
MAX_WIDTH = 16384


# num_heads only divides the row index: not specialising it on == 1 spares the 2-D and 3-D launches a variant each.
@triton.jit(do_not_specialize=["num_heads"])
def _rms_norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    residual_out_ptr,
    num_heads,
    width,
    stride_xt,
    stride_xh,
    stride_rt,
    stride_ot,
    stride_oh,
    stride_rot,
    eps,
    weight_offset,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Row (token, head) of x: optional residual add (rounded to x's dtype), RMSNorm, weight."""
    row = tl.program_id(0).to(tl.int64)
    token = row // num_heads
    head = row % num_heads
    cols = tl.arange(0, BLOCK)
    mask = cols < width
    x = tl.load(x_ptr + token * stride_xt + head * stride_xh + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        residual = tl.load(residual_ptr + token * stride_rt + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + residual.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(residual_out_ptr + token * stride_rot + cols, x, mask=mask)
    xf = x.to(tl.float32)
    normed = xf * tl.rsqrt(tl.sum(xf * xf, axis=0) / width + eps)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    # Gemma scales by (1 + w) in float32; Llama rounds the normalised row first, then multiplies by w.
    # A float, not a constexpr: one compiled variant serves both.
    rounded = normed.to(x_ptr.dtype.element_ty).to(tl.float32)
    out = tl.where(weight_offset != 0.0, normed * (weight_offset + weight), rounded * weight)
    tl.store(
        out_ptr + token * stride_ot + head * stride_oh + cols, out.to(out_ptr.dtype.element_ty), mask=mask
    )


def num_warps_for(block: int) -> int:
    """Warps for one row of `block` elements: about 256 elements a warp, 1 to 16."""
    return min(max(block // 256, 1), 16)


def _check(name: str, x: torch.Tensor, weight: torch.Tensor) -> None:
    if x.dim() not in (2, 3):
        raise KernelInputError(
            f"{name} must be [tokens, width] or [tokens, heads, width], got {tuple(x.shape)}"
        )
    check_dtype(name, x, FLOAT_DTYPES)
    check_unit_last_stride(name, x)
    width = x.shape[-1]
    if not 0 < width <= MAX_WIDTH:
        raise KernelInputError(f"{name} rows must hold 1 to {MAX_WIDTH} elements, got {width}")
    if weight.shape != (width,) or weight.dtype != x.dtype:
        raise KernelInputError(
            f"weight must be [{width}] of {x.dtype}, got {tuple(weight.shape)} of {weight.dtype}"
        )
    check_unit_last_stride("weight", weight)


def _launch(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    unit_offset: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    tensors = {"x": x, "weight": weight} | ({} if residual is None else {"residual": residual})
    check_same_device(tensors, is_interpreted(_rms_norm_kernel))
    x3 = x if x.dim() == 3 else x[:, None]
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    out3 = out if out.dim() == 3 else out[:, None]
    residual_out = None if residual is None else torch.empty_like(out)
    rows = x3.shape[0] * x3.shape[1]
    if rows == 0:
        return out, residual_out
    block = max(next_power_of_2(x.shape[-1]), MIN_BLOCK)
    _rms_norm_kernel[(rows,)](
        x3,
        x3 if residual is None else residual,
        weight,
        out3,
        out3 if residual_out is None else residual_out,
        x3.shape[1],
        x3.shape[2],
        x3.stride(0),
        x3.stride(1),
        0 if residual is None else residual.stride(0),
        out3.stride(0),
        out3.stride(1),
        0 if residual_out is None else residual_out.stride(0),
        eps,
        1.0 if unit_offset else 0.0,
        HAS_RESIDUAL=residual is not None,
        BLOCK=block,
        num_warps=num_warps_for(block),
    )
    return out, residual_out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, unit_offset: bool = False) -> torch.Tensor:
    """RMSNorm of every row of x [T, D] or [T, H, D] (strided rows allowed); see `rms_norm_ref`."""
    _check("x", x, weight)
    out, _ = _launch(x, None, weight, eps, unit_offset)
    return out


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, unit_offset: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(x + residual), x + residual) in one launch, both new tensors; see `fused_add_rms_norm_ref`."""
    _check("x", x, weight)
    if x.dim() != 2 or residual.shape != x.shape or residual.dtype != x.dtype:
        raise KernelInputError(
            f"x and residual must be [tokens, width] of one dtype, got {tuple(x.shape)} {x.dtype} "
            f"and {tuple(residual.shape)} {residual.dtype}"
        )
    check_unit_last_stride("residual", residual)
    out, residual_out = _launch(x, residual, weight, eps, unit_offset)
    assert residual_out is not None
    return out, residual_out


def compile_gate_cases() -> Iterator[Callable[[], object]]:
    """Launches on "meta" tensors covering every variant `_launch` can pick: dtype x residual x BLOCK.

    Widths: every power of two from MIN_BLOCK to MAX_WIDTH (each its own BLOCK and warp count), and 40
    (a masked tail, and strides that are not multiples of 16); head-shaped [T, H, D] rows (q/k norms)
    at the widths a head can have.
    """
    widths = [40] + [MIN_BLOCK << i for i in range((MAX_WIDTH // MIN_BLOCK).bit_length())]
    meta = torch.device("meta")
    for dtype in FLOAT_DTYPES:
        for width in widths:
            x = torch.empty(3, width, dtype=dtype, device=meta)
            w = torch.empty(width, dtype=dtype, device=meta)
            yield functools.partial(rms_norm, x, w, 1e-6)
            yield functools.partial(fused_add_rms_norm, x, x, w, 1e-6, unit_offset=True)
            if width <= 512:
                heads = torch.empty(3, 6, width, dtype=dtype, device=meta)[:, 1:4]
                yield functools.partial(rms_norm, heads, w, 1e-6, unit_offset=True)
