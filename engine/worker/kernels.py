"""Which implementation of every kernel a forward runs: the Triton kernels, or their torch twins.

One table per backend name (`attention_backend`, resolved by `engine.worker.attention.resolve_backend`:
Triton on CUDA, torch elsewhere). The name travels in `AttentionMetadata.backend`, so the attention
call and every model layer (norms, rotary, gated activation, routed experts, LoRA deltas) read the same choice;
nothing else in the engine decides between a kernel and its twin.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from fairserve_kernels.layer_reference import (
    act_and_mul_ref,
    fused_add_rms_norm_ref,
    rms_norm_ref,
    rotary_embedding_ref,
    rotary_store_ref,
)
from fairserve_kernels.lora_reference import lora_expand_ref, lora_shrink_ref
from fairserve_kernels.moe_reference import fused_moe_ref
from fairserve_kernels.reference import paged_attention_ref, store_kv_ref

Tensor = torch.Tensor
StoreFn = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], None]
AttnFn = Callable[..., Tensor]
NormFn = Callable[[Tensor, Tensor, float, bool], Tensor]
AddNormFn = Callable[[Tensor, Tensor, Tensor, float, bool], tuple[Tensor, Tensor]]
RotaryFn = Callable[[Tensor, Tensor, Tensor], Tensor]
RotaryStoreFn = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, int], Tensor]
ActFn = Callable[[Tensor, str], Tensor]
MoeFn = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]
ShrinkFn = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, int], Tensor]
ExpandFn = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, int, int], None]


@dataclass(frozen=True)
class Kernels:
    """The kernels of one backend, with the signatures of their twins in fairserve_kernels."""

    store_kv: StoreFn
    paged_attention: AttnFn
    rms_norm: NormFn
    fused_add_rms_norm: AddNormFn
    rotary_embedding: RotaryFn
    rotary_store: RotaryStoreFn
    act_and_mul: ActFn
    fused_moe: MoeFn
    lora_shrink: ShrinkFn
    lora_expand: ExpandFn


TORCH = Kernels(
    store_kv=store_kv_ref,
    paged_attention=paged_attention_ref,
    rms_norm=rms_norm_ref,
    fused_add_rms_norm=fused_add_rms_norm_ref,
    rotary_embedding=rotary_embedding_ref,
    rotary_store=rotary_store_ref,
    act_and_mul=act_and_mul_ref,
    fused_moe=fused_moe_ref,
    lora_shrink=lora_shrink_ref,
    lora_expand=lora_expand_ref,
)


@functools.cache
def _triton() -> Kernels:
    # Imported on first use: Triton reads TRITON_INTERPRET when the kernels are decorated, and a CPU
    # engine never needs Triton at all. Tests that reload the kernel modules call cache_clear().
    from fairserve_kernels import (
        triton_activation,
        triton_attention,
        triton_lora,
        triton_moe,
        triton_norm,
        triton_rotary,
        triton_store,
    )

    return Kernels(
        store_kv=triton_store.store_kv,
        paged_attention=triton_attention.paged_attention,
        rms_norm=triton_norm.rms_norm,
        fused_add_rms_norm=triton_norm.fused_add_rms_norm,
        rotary_embedding=triton_rotary.rotary_embedding,
        rotary_store=triton_rotary.rotary_store,
        act_and_mul=triton_activation.act_and_mul,
        fused_moe=triton_moe.fused_moe,
        lora_shrink=triton_lora.sgmv_shrink,
        lora_expand=triton_lora.sgmv_expand,
    )


def kernels(backend: str) -> Kernels:
    """The table of a resolved backend name: "triton", or the torch twins for anything else ("torch")."""
    return _triton() if backend == "triton" else TORCH


def clear_cache() -> None:
    """Forget the Triton table, so the next lookup imports the kernel modules as they are now (tests
    reload them under TRITON_INTERPRET, or patch them)."""
    _triton.cache_clear()
