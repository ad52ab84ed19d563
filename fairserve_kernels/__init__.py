"""Attention and fused-MoE kernels: Triton for CUDA, torch reference twins for CPU and for tests. Imports nothing of ours.

`store_kv` and `paged_attention` (the Triton kernels) are imported on first use, so `import fairserve_kernels`
works where Triton is absent and TRITON_INTERPRET can still be set before they are built.
"""

from __future__ import annotations

from typing import Any

from fairserve_kernels.reference import paged_attention_ref, store_kv_ref

__all__ = ["paged_attention", "paged_attention_ref", "store_kv", "store_kv_ref"]


def __getattr__(name: str) -> Any:
    if name == "paged_attention":
        from fairserve_kernels.triton_attention import paged_attention

        return paged_attention
    if name == "store_kv":
        from fairserve_kernels.triton_store import store_kv

        return store_kv
    raise AttributeError(f"module 'fairserve_kernels' has no attribute {name!r}")
