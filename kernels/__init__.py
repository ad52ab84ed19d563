"""Attention kernels: Triton for CUDA, torch reference twins for CPU and for tests. Imports nothing of ours."""

from kernels.reference import paged_attention_ref, store_kv_ref

__all__ = ["paged_attention_ref", "store_kv_ref"]
