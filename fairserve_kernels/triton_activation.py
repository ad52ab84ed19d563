# Triton kernels are a DSL: `triton.jit` is untyped and kernel arguments take Triton's own annotations.
# mypy: allow-untyped-defs, allow-incomplete-defs, allow-untyped-decorators
"""Triton gated activation: act(gate) * up over the merged gate/up GEMM's output, one launch.

Twin: `fairserve_kernels.layer_reference.act_and_mul_ref` (SiLU for Llama/Qwen/Mistral, tanh-GELU for
Gemma 3). A program takes one token and BLOCK columns of its intermediate row; the activation is
computed in float32 and rounded to the activation dtype before the product, as the twin rounds.
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
from fairserve_kernels.layer_reference import GATED_ACTIVATIONS

# Columns of the intermediate row one program computes (fixed: one compiled variant per dtype and activation).
BLOCK = 1024
# sqrt(2 / pi), tanh-GELU's scale; a constexpr because Triton's compiler refuses other globals.
GELU_SCALE: tl.constexpr = tl.constexpr(0.7978845608028654)


@triton.jit
def _act_and_mul_kernel(
    x_ptr,
    out_ptr,
    inter,
    stride_xt,
    stride_ot,
    GELU_TANH: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """out[t, c] = act(x[t, c]) * x[t, inter + c] for the token program_id(0) and BLOCK columns."""
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    gate = tl.load(x_ptr + token * stride_xt + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + token * stride_xt + inter + cols, mask=mask, other=0.0).to(tl.float32)
    # exp of -|.| only: no overflow in either tail (the interpreter's numpy would warn on inf).
    if GELU_TANH:
        inner = GELU_SCALE * (gate + 0.044715 * gate * gate * gate)
        e = tl.exp(-2.0 * tl.abs(inner))
        tanh = tl.where(inner >= 0, 1.0, -1.0) * (1.0 - e) / (1.0 + e)
        act = 0.5 * gate * (1.0 + tanh)
    else:
        e = tl.exp(-tl.abs(gate))
        act = gate * tl.where(gate >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
    dtype = out_ptr.dtype.element_ty
    out = act.to(dtype).to(tl.float32) * up
    tl.store(out_ptr + token * stride_ot + cols, out.to(dtype), mask=mask)


def act_and_mul(x: torch.Tensor, activation: str = "silu") -> torch.Tensor:
    """act(x[:, :I]) * x[:, I:] for x [N, 2I] into a new [N, I] tensor; see `act_and_mul_ref`."""
    if activation not in GATED_ACTIVATIONS:
        raise KernelInputError(
            f"activation must be one of {', '.join(GATED_ACTIVATIONS)}, got {activation!r}"
        )
    check_rank("x", x, 2)
    check_dtype("x", x, FLOAT_DTYPES)
    check_unit_last_stride("x", x)
    if x.shape[1] % 2:
        raise KernelInputError(f"x must hold gate and up halves of equal width, got {x.shape[1]} columns")
    check_same_device({"x": x}, is_interpreted(_act_and_mul_kernel))
    num_tokens, inter = x.shape[0], x.shape[1] // 2
    out = torch.empty((num_tokens, inter), dtype=x.dtype, device=x.device)
    if num_tokens == 0 or inter == 0:
        return out
    _act_and_mul_kernel[(num_tokens, triton.cdiv(inter, BLOCK))](
        x,
        out,
        inter,
        x.stride(0),
        out.stride(0),
        GELU_TANH=activation == "gelu_tanh",
        BLOCK=BLOCK,
        num_warps=4,
    )
    return out


def compile_gate_cases() -> Iterator[Callable[[], object]]:
    """Launches on "meta" tensors covering every (dtype, activation) variant, each with an intermediate
    size that is a multiple of 16 and one that is not (Triton specialises the int and the strides on it)."""
    meta = torch.device("meta")
    for dtype in FLOAT_DTYPES:
        for activation in GATED_ACTIVATIONS:
            for inter in (1408, 1003):
                x = torch.empty(3, 2 * inter, dtype=dtype, device=meta)
                yield functools.partial(act_and_mul, x, activation)
