"""Torch twins of the fused layer kernels (RMSNorm with its residual add, rotary embedding, gated activation).

The CPU path of every model layer and the oracle of the Triton kernels' tests
(fairserve_kernels/triton_norm.py, triton_rotary.py, triton_activation.py). Each twin rounds where
Hugging Face's modelling code rounds (to the activation dtype), so a model on the twins matches
transformers, and a kernel that computes in float32 and rounds at the same points matches the twin.

Layouts:
- norms: `x [..., D]`, `weight [D]`; `unit_offset` (Gemma) scales by `1 + weight` in float32, otherwise
  the normalised row is cast to the activation dtype first and then multiplied by `weight` (Llama, Qwen);
- rotary: `x [N, H, D]` holds the heads to rotate (q and k adjacent), `cos, sin [N, D]` one row per token,
  with rotate-half's minus sign folded into the first half of `sin` (see `signed_sin`);
- gated activation: `x [N, 2I]` is gate (first I columns) then up, as the merged gate/up GEMM writes it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fairserve_kernels.reference import store_kv_ref

# The gated MLP activations the kernels implement: SiLU (Llama, Qwen, Mistral) and tanh-GELU (Gemma 3).
GATED_ACTIVATIONS: tuple[str, ...] = ("silu", "gelu_tanh")


def rms_norm_ref(
    x: torch.Tensor, weight: torch.Tensor, eps: float, unit_offset: bool = False
) -> torch.Tensor:
    """RMSNorm over the last dimension, statistics in float32; returns x's shape and dtype."""
    if unit_offset:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        return (xf * (1.0 + weight.float())).to(x.dtype)
    if x.dtype == torch.float32:
        return F.rms_norm(x, weight.shape, weight, eps)  # one fused CPU kernel, same math
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def fused_add_rms_norm_ref(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, unit_offset: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(x + residual), x + residual): the block's output added to the residual stream, then the next norm.

    The sum is rounded to the activation dtype before it is normalised, as `h = h + block(h)` is in HF.
    Neither input is modified.
    """
    summed = x + residual
    return rms_norm_ref(summed, weight, eps, unit_offset), summed


def signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """sin with rotate-half's minus sign folded into its first half, so a rotation is x*cos + roll(x)*sin."""
    half = sin.shape[-1] // 2
    sign = torch.cat((-torch.ones(half), torch.ones(sin.shape[-1] - half))).to(sin.device, sin.dtype)
    return sin * sign


def rotary_embedding_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate every head of x [N, H, D] by its token's angles (neox / rotate-half layout).

    HF's x*cos + rotate_half(x)*sin, with rotate_half as one `roll` because `sin` is sign-folded
    (`signed_sin`); products and sum rounded in x's dtype as HF's are.
    """
    return x * cos.unsqueeze(1) + x.roll(x.shape[-1] // 2, dims=-1) * sin.unsqueeze(1)


def rotary_store_ref(
    qk: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    num_q_heads: int,
) -> torch.Tensor:
    """Rotate q and k (`qk [N, Hq + Hk, D]`), store the rotated k and `v [N, Hk, D]` into the paged cache
    at `slot_mapping` (slots < 0 skipped), and return the rotated q [N, Hq, D]: the decode step's rotary
    and KV store as one call (the Triton kernel does both in one launch)."""
    rotated = rotary_embedding_ref(qk, cos, sin)
    store_kv_ref(rotated[:, num_q_heads:], v, k_cache, v_cache, slot_mapping)
    return rotated[:, :num_q_heads]


def act_and_mul_ref(x: torch.Tensor, activation: str = "silu") -> torch.Tensor:
    """act(gate) * up for x = [gate | up] of shape [N, 2I]; returns [N, I] (act rounded to x's dtype first)."""
    if activation not in GATED_ACTIVATIONS:
        raise ValueError(f"activation must be one of {', '.join(GATED_ACTIVATIONS)}, got {activation!r}")
    gate, up = x.chunk(2, dim=-1)
    act = F.gelu(gate, approximate="tanh") if activation == "gelu_tanh" else F.silu(gate)
    return act * up
