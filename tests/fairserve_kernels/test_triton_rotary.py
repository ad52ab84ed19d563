"""Triton rotary embedding against its torch twin and against HF's rotate_half formula."""

from __future__ import annotations

import pytest
import torch

from fairserve_kernels.checks import KernelInputError
from fairserve_kernels.layer_reference import rotary_embedding_ref, rotary_store_ref, signed_sin
from fairserve_kernels.triton_rotary import rotary_embedding, rotary_store

TOLERANCE = {torch.float32: 1e-6, torch.float16: 1e-3}


def _tables(
    positions: torch.Tensor, head_dim: int, theta: float = 10000.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [N, D] for the positions, neox layout (the two halves repeat)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
    freqs = torch.outer(positions.float(), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("head_dim", [32, 64, 80, 96, 128, 256])
def test_q_and_k_of_merged_qkv_match_twin(device: torch.device, dtype: torch.dtype, head_dim: int) -> None:
    """The models' call: q and k heads as one strided [N, Hq + Hk, D] view of the qkv output."""
    gen = torch.Generator().manual_seed(head_dim)
    num_q, num_kv, tokens = 6, 2, 9
    qkv = torch.randn(tokens, num_q + 2 * num_kv, head_dim, generator=gen).to(dtype)
    cos, sin = _tables(torch.randint(0, 4096, (tokens,), generator=gen), head_dim)
    cos, ssin = cos.to(dtype), signed_sin(sin).to(dtype)
    qk = qkv[:, : num_q + num_kv]
    expected = rotary_embedding_ref(qk, cos, ssin)
    got = rotary_embedding(qkv.to(device)[:, : num_q + num_kv], cos.to(device), ssin.to(device))
    assert got.shape == expected.shape and got.dtype == dtype and got.is_contiguous()
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(got.cpu(), expected, atol=tol, rtol=tol)


def test_matches_hf_rotate_half(device: torch.device) -> None:
    """Independent of the twin: HF's x*cos + rotate_half(x)*sin with the plain sin table."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(5, 3, 64, generator=gen)
    cos, sin = _tables(torch.arange(5) * 37, 64)
    rotated = torch.cat((-x[..., 32:], x[..., :32]), dim=-1)
    expected = x * cos[:, None] + rotated * sin[:, None]
    got = rotary_embedding(x.to(device), cos.to(device), signed_sin(sin).to(device)).cpu()
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)


def test_position_zero_is_the_identity(device: torch.device) -> None:
    x = torch.randn(2, 4, 80, generator=torch.Generator().manual_seed(2))
    cos, sin = _tables(torch.zeros(2), 80)
    assert torch.equal(rotary_embedding(x.to(device), cos.to(device), sin.to(device)).cpu(), x)


def test_bad_arguments_are_named(device: torch.device) -> None:
    x = torch.zeros(3, 2, 64, device=device)
    table = torch.zeros(3, 64, device=device)
    with pytest.raises(KernelInputError, match="head_dim must be even"):
        rotary_embedding(torch.zeros(3, 2, 63, device=device), table[:, :63], table[:, :63])
    with pytest.raises(KernelInputError, match="cos must be"):
        rotary_embedding(x, table[:2], table)
    with pytest.raises(KernelInputError, match="sin must be"):
        rotary_embedding(x, table, table.half())
    with pytest.raises(KernelInputError, match="x must have 3 dimensions"):
        rotary_embedding(x[0], table, table)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("head_dim", [32, 80, 128])
@pytest.mark.parametrize("num_kv", [1, 2, 9])
def test_rotary_with_the_store_folded_in_matches_the_twin(
    device: torch.device, dtype: torch.dtype, head_dim: int, num_kv: int
) -> None:
    """One launch rotates q and k, stores the rotated k and v at their slots (a padding row, slot -1,
    stores nothing) and returns q; the twin rotates, then stores. Nine kv heads take two programs' tiles
    of v at head_dim 128 (BLOCK_H 16 > 9 at 32)."""
    gen = torch.Generator().manual_seed(head_dim + num_kv)
    num_q, tokens, blocks, block_size = 2 * num_kv, 7, 5, 4
    qkv = torch.randn(tokens, num_q + 2 * num_kv, head_dim, generator=gen).to(dtype)
    cos, sin = _tables(torch.randint(0, 4096, (tokens,), generator=gen), head_dim)
    cos, ssin = cos.to(dtype), signed_sin(sin).to(dtype)
    slots = torch.randperm(blocks * block_size, generator=gen)[:tokens]
    slots[3] = -1
    caches = [torch.randn(blocks, block_size, num_kv, head_dim, generator=gen).to(dtype) for _ in range(2)]
    heads = num_q + num_kv
    k_ref, v_ref = (c.clone() for c in caches)
    expected = rotary_store_ref(qkv[:, :heads], qkv[:, heads:], cos, ssin, k_ref, v_ref, slots, num_q)
    on = qkv.to(device)
    k_got, v_got = (c.clone().to(device) for c in caches)
    got = rotary_store(
        on[:, :heads], on[:, heads:], cos.to(device), ssin.to(device), k_got, v_got, slots.to(device), num_q
    )
    tol = TOLERANCE[dtype]
    assert got.shape == (tokens, num_q, head_dim) and got.dtype == dtype
    torch.testing.assert_close(got.cpu(), expected, atol=tol, rtol=tol)
    torch.testing.assert_close(k_got.cpu(), k_ref, atol=tol, rtol=tol)
    assert torch.equal(v_got.cpu(), v_ref)  # a copy: exact
    untouched = torch.ones(blocks * block_size, dtype=torch.bool)
    untouched[slots[slots >= 0]] = False
    assert torch.equal(
        k_got.cpu().view(-1, num_kv, head_dim)[untouched], caches[0].view(-1, num_kv, head_dim)[untouched]
    )


def test_rotary_store_names_a_bad_split(device: torch.device) -> None:
    qk = torch.zeros(3, 4, 64, device=device)
    table = torch.zeros(3, 64, device=device)
    cache = torch.zeros(2, 4, 2, 64, device=device)
    slots = torch.zeros(3, dtype=torch.int64, device=device)
    with pytest.raises(KernelInputError, match="num_q_heads"):
        rotary_store(qk, torch.zeros(3, 1, 64, device=device), table, table, cache, cache, slots, 2)
