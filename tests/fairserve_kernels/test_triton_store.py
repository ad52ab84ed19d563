"""Triton KV-cache store against its torch twin: block sizes, padding slots, dtype casts, strided inputs."""

from __future__ import annotations

import re

import pytest
import torch

from fairserve_kernels.checks import KernelInputError
from fairserve_kernels.reference import store_kv_ref
from fairserve_kernels.triton_store import store_kv


def _slots(num_tokens: int, num_blocks: int, block_size: int, gen: torch.Generator) -> torch.Tensor:
    """Distinct random slots with every third token marked as padding (-1)."""
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[::3] = -1
    return slots


@pytest.mark.parametrize("block_size", [1, 8, 16, 32, 64, 128])
@pytest.mark.parametrize(
    ("src_dtype", "cache_dtype"),
    [(torch.float32, torch.float32), (torch.float16, torch.float16), (torch.float32, torch.float16)],
)
def test_matches_reference(
    device: torch.device, block_size: int, src_dtype: torch.dtype, cache_dtype: torch.dtype
) -> None:
    gen = torch.Generator().manual_seed(block_size)
    num_kv_heads, head_dim, num_tokens = 3, 80, 13
    num_blocks = max(4, 2 * num_tokens // block_size)
    key = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(src_dtype)
    value = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(src_dtype)
    cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen).to(cache_dtype)
    slots = _slots(num_tokens, num_blocks, block_size, gen)
    expected_k, expected_v = cache.clone(), cache.clone() + 1
    store_kv_ref(key, value, expected_k, expected_v, slots)
    k_cache, v_cache = (cache.clone().to(device), (cache.clone() + 1).to(device))
    store_kv(key.to(device), value.to(device), k_cache, v_cache, slots.to(device))
    assert torch.equal(k_cache.cpu(), expected_k)
    assert torch.equal(v_cache.cpu(), expected_v)


def test_padding_slots_leave_the_cache_untouched(device: torch.device) -> None:
    key = torch.ones(4, 2, 64, device=device)
    k_cache = torch.zeros(2, 16, 2, 64, device=device)
    v_cache = torch.zeros_like(k_cache)
    store_kv(key, key, k_cache, v_cache, torch.tensor([-1, -1, -1, -1], device=device))
    assert not k_cache.any() and not v_cache.any()


def test_strided_key_value_from_fused_projection(device: torch.device) -> None:
    """K and V as views into one [tokens, (Hkv + Hkv) * D] projection output, int64 slots."""
    gen = torch.Generator().manual_seed(7)
    num_tokens, num_kv_heads, head_dim, block_size = 9, 2, 64, 16
    fused = torch.randn(num_tokens, 2 * num_kv_heads * head_dim, generator=gen)
    key = fused[:, : num_kv_heads * head_dim].view(num_tokens, num_kv_heads, head_dim)
    value = fused[:, num_kv_heads * head_dim :].view(num_tokens, num_kv_heads, head_dim)
    assert not key.is_contiguous()
    slots = _slots(num_tokens, 3, block_size, gen).long()
    expected_k = torch.zeros(3, block_size, num_kv_heads, head_dim)
    expected_v = torch.zeros_like(expected_k)
    store_kv_ref(key, value, expected_k, expected_v, slots)
    k_cache, v_cache = (
        expected_k.new_zeros(expected_k.shape, device=device),
        expected_v.new_zeros(expected_v.shape, device=device),
    )
    fused_dev = fused.to(device)
    store_kv(
        fused_dev[:, : num_kv_heads * head_dim].view(num_tokens, num_kv_heads, head_dim),
        fused_dev[:, num_kv_heads * head_dim :].view(num_tokens, num_kv_heads, head_dim),
        k_cache,
        v_cache,
        slots.to(device),
    )
    assert torch.equal(k_cache.cpu(), expected_k) and torch.equal(v_cache.cpu(), expected_v)


def test_empty_batch_is_a_no_op(device: torch.device) -> None:
    k_cache = torch.zeros(2, 16, 2, 64, device=device)
    empty = torch.empty(0, 2, 64, device=device)
    store_kv(empty, empty, k_cache, k_cache.clone(), torch.empty(0, dtype=torch.int64, device=device))
    assert not k_cache.any()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda a: a.update(key=a["key"][0]), "key must have 3 dimensions"),
        (lambda a: a.update(value=a["value"][:, :1]), "key and value must have the same shape"),
        (lambda a: a.update(key=a["key"][:, :1], value=a["value"][:, :1]), "[num_kv_heads, head_dim]"),
        (lambda a: a.update(v_cache=a["v_cache"].half()), "k_cache and v_cache must match"),
        (lambda a: a.update(slot_mapping=a["slot_mapping"][:2]), "slot_mapping has 2 entries for 4 tokens"),
        (lambda a: a.update(slot_mapping=a["slot_mapping"].float()), "slot_mapping must be one of"),
        (lambda a: a.update(key=a["key"].int()), "key must be one of"),
        (lambda a: a.update(k_cache=a["k_cache"].transpose(2, 3)), "k_cache must be contiguous in its last"),
        (
            lambda a: a.update(key=a["key"].transpose(1, 2).contiguous().transpose(1, 2)),
            "contiguous in its last",
        ),
    ],
)
def test_bad_input_is_refused_before_launch(device: torch.device, change, message: str) -> None:  # type: ignore[no-untyped-def]
    args = {
        "key": torch.randn(4, 2, 64, device=device),
        "value": torch.randn(4, 2, 64, device=device),
        "k_cache": torch.zeros(2, 16, 2, 64, device=device),
        "v_cache": torch.zeros(2, 16, 2, 64, device=device),
        "slot_mapping": torch.tensor([0, 1, -1, 5], device=device),
    }
    change(args)
    with pytest.raises(KernelInputError, match=re.escape(message)):
        store_kv(**args)
