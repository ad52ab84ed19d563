# Triton kernels are a DSL: `triton.jit` is untyped and kernel arguments take Triton's own annotations.
# mypy: allow-untyped-defs, allow-incomplete-defs, allow-untyped-decorators
"""Triton KV-cache store: scatter this step's K/V rows into the paged cache through `slot_mapping`.

Twin of `fairserve_kernels.reference.store_kv_ref`; layouts are documented there.
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
def _store_kv_kernel(
    key_ptr,
    value_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_kcb,
    stride_kcs,
    stride_kch,
    stride_vcb,
    stride_vcs,
    stride_vch,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """One program per token: copy its [num_kv_heads, head_dim] K and V rows to their cache slot."""
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:  # padding token: nothing to store
        return
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    heads = tl.arange(0, BLOCK_H)
    dims = tl.arange(0, BLOCK_D)
    mask = (heads[:, None] < NUM_KV_HEADS) & (dims[None, :] < HEAD_DIM)
    key = tl.load(key_ptr + token * stride_kt + heads[:, None] * stride_kh + dims[None, :], mask=mask)
    value = tl.load(value_ptr + token * stride_vt + heads[:, None] * stride_vh + dims[None, :], mask=mask)
    k_dst = (
        k_cache_ptr + block * stride_kcb + offset * stride_kcs + heads[:, None] * stride_kch + dims[None, :]
    )
    v_dst = (
        v_cache_ptr + block * stride_vcb + offset * stride_vcs + heads[:, None] * stride_vch + dims[None, :]
    )
    tl.store(k_dst, key.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_dst, value.to(v_cache_ptr.dtype.element_ty), mask=mask)


def check_store_args(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    check_rank("key", key, 3)
    check_rank("value", value, 3)
    check_rank("k_cache", k_cache, 4)
    check_rank("v_cache", v_cache, 4)
    check_rank("slot_mapping", slot_mapping, 1)
    for name, tensor in (("key", key), ("value", value), ("k_cache", k_cache), ("v_cache", v_cache)):
        check_dtype(name, tensor, FLOAT_DTYPES)
        check_unit_last_stride(name, tensor)
    check_dtype("slot_mapping", slot_mapping, INDEX_DTYPES)
    if k_cache.shape != v_cache.shape or k_cache.dtype != v_cache.dtype:
        raise KernelInputError(
            f"k_cache and v_cache must match, got {tuple(k_cache.shape)} {k_cache.dtype} "
            f"and {tuple(v_cache.shape)} {v_cache.dtype}"
        )
    if key.shape != value.shape:
        raise KernelInputError(
            f"key and value must have the same shape, got {tuple(key.shape)} and {tuple(value.shape)}"
        )
    if key.shape[1:] != k_cache.shape[2:]:
        raise KernelInputError(
            f"key rows are [num_kv_heads, head_dim] = {tuple(key.shape[1:])} but the cache holds {tuple(k_cache.shape[2:])}"
        )
    if slot_mapping.shape[0] != key.shape[0]:
        raise KernelInputError(f"slot_mapping has {slot_mapping.shape[0]} entries for {key.shape[0]} tokens")
    if k_cache.shape[1] < 1:
        raise KernelInputError("the cache block size must be >= 1")


def store_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Scatter new K/V rows into the paged cache at their slots, skipping slots < 0 (see `store_kv_ref`)."""
    check_store_args(key, value, k_cache, v_cache, slot_mapping)
    check_same_device(
        {"key": key, "value": value, "k_cache": k_cache, "v_cache": v_cache, "slot_mapping": slot_mapping},
        is_interpreted(_store_kv_kernel),
    )
    num_tokens = key.shape[0]
    if num_tokens == 0:
        return
    _, block_size, num_kv_heads, head_dim = k_cache.shape
    _store_kv_kernel[(num_tokens,)](
        key,
        value,
        k_cache,
        v_cache,
        slot_mapping,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        BLOCK_H=triton.next_power_of_2(num_kv_heads),
        BLOCK_D=triton.next_power_of_2(head_dim),
    )


def compile_gate_cases() -> Iterator[Callable[[], object]]:
    """Stores on "meta" tensors for every dtype, kv-head count, head dim and cache block size; see compile_gate.py."""
    for dtype, kv_heads, head_dim, block_size in itertools.product(
        (torch.bfloat16, torch.float16, torch.float32),
        (1, 2, 4, 8),
        (64, 80, 96, 128, 160, 192, 256),
        (1, 16, 32, 64),
    ):
        yield functools.partial(_gate_store, dtype, kv_heads, head_dim, block_size)


def _gate_store(dtype: torch.dtype, kv_heads: int, head_dim: int, block_size: int) -> None:
    meta = torch.device("meta")
    rows = torch.empty(8, kv_heads, head_dim, dtype=dtype, device=meta)
    cache = torch.empty(4, block_size, kv_heads, head_dim, dtype=dtype, device=meta)
    store_kv(rows, rows, cache, cache, torch.empty(8, dtype=torch.int64, device=meta))
