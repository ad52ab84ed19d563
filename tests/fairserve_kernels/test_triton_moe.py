"""Triton fused MoE against its torch twin: expert counts, top_k, empty experts, dtypes, bad arguments."""

from __future__ import annotations

import pytest
import torch

from fairserve_kernels.checks import KernelInputError
from fairserve_kernels.moe_reference import fused_moe_ref, route
from fairserve_kernels.triton_moe import align_by_expert, fused_moe


def _moe_inputs(
    tokens: int, hidden: int, inter: int, experts: int, top_k: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=gen) * hidden**-0.5
    w2 = torch.randn(experts, hidden, inter, generator=gen) * inter**-0.5
    weights, ids = route(torch.randn(tokens, experts, generator=gen), top_k, normalise=seed % 2 == 0)
    return x, w13, w2, weights, ids


@pytest.mark.parametrize(
    ("tokens", "hidden", "inter", "experts", "top_k"),
    [(1, 64, 32, 4, 2), (13, 64, 32, 4, 2), (37, 64, 48, 8, 3), (20, 96, 32, 3, 1)],
)
def test_matches_reference(
    device: torch.device, tokens: int, hidden: int, inter: int, experts: int, top_k: int
) -> None:
    x, w13, w2, weights, ids = _moe_inputs(tokens, hidden, inter, experts, top_k, seed=tokens)
    expected = fused_moe_ref(x, w13, w2, weights, ids)
    got = fused_moe(x.to(device), w13.to(device), w2.to(device), weights.to(device), ids.to(device))
    torch.testing.assert_close(got.cpu(), expected, atol=1e-5, rtol=1e-4)


def test_experts_nobody_picked_and_half_precision(device: torch.device) -> None:
    x, w13, w2, _, _ = _moe_inputs(9, 64, 32, 6, 2, seed=3)
    ids = torch.tensor([[0, 5]] * 9)  # experts 1..4 get no tokens
    weights = torch.full((9, 2), 0.5)
    expected = fused_moe_ref(x, w13, w2, weights, ids)
    got = fused_moe(x.to(device), w13.to(device), w2.to(device), weights.to(device), ids.to(device))
    torch.testing.assert_close(got.cpu(), expected, atol=1e-5, rtol=1e-4)
    # Triton's interpreter computes bfloat16 through numpy, which has no such type: bf16 on CUDA only.
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float16
    half = [t.to(device, dtype) for t in (x, w13, w2, weights)]
    got_half = fused_moe(half[0], half[1], half[2], half[3], ids.to(device))
    assert got_half.dtype == dtype
    torch.testing.assert_close(got_half.float().cpu(), expected, atol=5e-2, rtol=5e-2)


def test_alignment_pads_each_expert_to_whole_tiles() -> None:
    ids = torch.tensor([[2, 0], [2, 1], [0, 2]])
    pairs, tile_experts = align_by_expert(ids, num_experts=4, block_m=4)
    # Sized for the worst case without a host read (ceil(6 / 4) + 4 experts = 6 tiles): the three used
    # tiles first (expert 3 has no tokens, so no tile of its own), then spare tiles of padding only.
    assert tile_experts.tolist()[:3] == [0, 1, 2] and len(tile_experts) == 6
    assert (
        pairs.tolist() == [1, 4, 6, 6, 3, 6, 6, 6, 0, 2, 5, 6] + [6] * 12
    )  # pair = token * top_k + k; 6 = padding


def test_bad_arguments_are_named(device: torch.device) -> None:
    x, w13, w2, weights, ids = (t.to(device) for t in _moe_inputs(4, 64, 32, 4, 2, seed=1))
    with pytest.raises(KernelInputError, match="w13"):
        fused_moe(x, w13[:, :, :32], w2, weights, ids)
    with pytest.raises(KernelInputError, match="topk_weights"):
        fused_moe(x, w13, w2, weights[:, :1], ids)
    with pytest.raises(KernelInputError, match="topk_ids"):
        fused_moe(x, w13, w2, weights, ids.float())
