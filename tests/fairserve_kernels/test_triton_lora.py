"""Triton SGMV shrink/expand against the torch twin: mixed slots, rows without an adapter, padded ranks."""

from __future__ import annotations

import pytest
import torch

from fairserve_kernels.checks import KernelInputError
from fairserve_kernels.lora_reference import _row_slots, lora_expand_ref, lora_shrink_ref
from fairserve_kernels.triton_lora import sgmv_expand, sgmv_shrink

Segments = tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]


def _segments(token_slots: list[int]) -> Segments:
    """Sorted segments from each token's slot (-1: no adapter), as engine/worker/lora/batch.py builds them."""
    used = sorted({s for s in token_slots if s >= 0})
    rows = [t for slot in used for t, s in enumerate(token_slots) if s == slot]
    lengths = [token_slots.count(slot) for slot in used]
    starts = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    return (
        torch.tensor(rows, dtype=torch.int32),
        starts,
        torch.tensor(used, dtype=torch.int32),
        max(lengths, default=0),
    )


def _stacks(slots: int, r_max: int, ranks: list[int], d_in: int, d_out: int) -> tuple[torch.Tensor, ...]:
    """A and B stacks with slot i of rank ranks[i] (zero-padded to r_max), and per-slot scales."""
    gen = torch.Generator().manual_seed(slots * 31 + r_max)
    a = torch.zeros(slots, r_max, d_in)
    b = torch.zeros(slots, d_out, r_max)
    for slot, rank in enumerate(ranks):
        a[slot, :rank] = torch.randn(rank, d_in, generator=gen) * d_in**-0.5
        b[slot, :, :rank] = torch.randn(d_out, rank, generator=gen)
    scales = torch.tensor([2.0 / max(r, 1) for r in ranks], dtype=torch.float32)
    return a, b, scales


@pytest.mark.parametrize(
    ("token_slots", "ranks", "d_in", "d_out", "col_start"),
    [
        ([0, -1, 2, 0, 1, -1, 2, 2], [4, 16, 8], 48, 40, 24),  # mixed slots, rows without an adapter
        ([1] * 37 + [-1] * 3 + [0] * 20, [8, 32], 96, 80, 0),  # prefill-long segments: 64-row tiles
        ([3, 1], [2, 8, 8, 72], 64, 33, 7),  # one token each; a rank over one 64-wide tile
    ],
)
def test_shrink_then_expand_matches_the_twin(
    device: torch.device, token_slots: list[int], ranks: list[int], d_in: int, d_out: int, col_start: int
) -> None:
    r_max = max(ranks)
    a, b, scales = _stacks(len(ranks), r_max, ranks, d_in, d_out)
    x = torch.randn(len(token_slots), d_in, generator=torch.Generator().manual_seed(5))
    out = torch.randn(len(token_slots), col_start + d_out + 5, generator=torch.Generator().manual_seed(6))
    rows, starts, slots, longest = _segments(token_slots)
    h_ref = lora_shrink_ref(x, a, rows, starts, slots, longest)
    expected = out.clone()
    lora_expand_ref(expected, h_ref, b, scales, rows, starts, slots, longest, col_start)

    on = [t.to(device) for t in (x, a, b, scales, rows, starts, slots)]
    h = sgmv_shrink(on[0], on[1], on[4], on[5], on[6], longest)
    torch.testing.assert_close(h.cpu(), h_ref, atol=1e-5, rtol=1e-4)
    got = out.clone().to(device)
    sgmv_expand(got, h, on[2], on[3], on[4], on[5], on[6], longest, col_start)
    torch.testing.assert_close(got.cpu(), expected, atol=1e-5, rtol=1e-4)
    untouched = [t for t, s in enumerate(token_slots) if s < 0]
    assert torch.equal(got.cpu()[untouched], out[untouched])  # rows without an adapter: never written
    assert torch.equal(got.cpu()[:, :col_start], out[:, :col_start])  # other modules' columns
    assert not torch.equal(got.cpu(), out)


@pytest.mark.parametrize(
    ("token_slots", "gathered"),
    [([1, -1, 0, 1], True), ([1] * 10 + [-1] + [0] * 9, False)],  # decode-like: gathered; prefill: a loop
)
def test_the_twin_is_the_per_adapter_lora_delta(token_slots: list[int], gathered: bool) -> None:
    """The oracle itself against the plain formula y += scale * (x @ A^T) @ B^T, per token's own adapter."""
    a, b, scales = _stacks(2, 8, [3, 8], 16, 12)
    x = torch.randn(len(token_slots), 16, generator=torch.Generator().manual_seed(1))
    out = torch.zeros(len(token_slots), 12)
    rows, starts, slots, longest = _segments(token_slots)
    assert (_row_slots(rows, starts, slots, 16, 8) is not None) == gathered
    h = lora_shrink_ref(x, a, rows, starts, slots, longest)
    lora_expand_ref(out, h, b, scales, rows, starts, slots, longest, 0)
    for token, slot in enumerate(token_slots):
        want = torch.zeros(12) if slot < 0 else scales[slot] * (x[token] @ a[slot].t()) @ b[slot].t()
        torch.testing.assert_close(out[token], want, atol=1e-5, rtol=1e-5)


def test_no_adapted_rows_is_a_no_op(device: torch.device) -> None:
    a, b, scales = _stacks(2, 8, [8, 8], 16, 16)
    x, out = torch.randn(3, 16).to(device), torch.randn(3, 16).to(device)
    empty, starts, slots = (
        torch.zeros(0, dtype=torch.int32),
        torch.zeros(1, dtype=torch.int32),
        torch.zeros(0, dtype=torch.int32),
    )
    seg = [t.to(device) for t in (empty, starts, slots)]
    h = sgmv_shrink(x, a.to(device), seg[0], seg[1], seg[2], 0)
    before = out.clone()
    sgmv_expand(out, h, b.to(device), scales.to(device), seg[0], seg[1], seg[2], 0, 0)
    assert h.shape == (0, 8) and torch.equal(out, before)


def test_bad_arguments_name_themselves(device: torch.device) -> None:
    a, b, scales = _stacks(2, 8, [8, 8], 16, 16)
    host_rows, host_starts, host_slots, longest = _segments([0, 1])
    rows, starts, slots = host_rows.to(device), host_starts.to(device), host_slots.to(device)
    with pytest.raises(KernelInputError, match=r"a must be a contiguous \[slots, r_max, 24\]"):
        sgmv_shrink(torch.randn(2, 24).to(device), a.to(device), rows, starts, slots, longest)
    with pytest.raises(KernelInputError, match="seg_starts must have one more entry"):
        sgmv_shrink(torch.randn(2, 16).to(device), a.to(device), rows, starts[:2], slots, longest)
    h = torch.zeros(2, 8, device=device)
    with pytest.raises(KernelInputError, match="col_start 4 \\+ d_out 16 exceeds out's 16 columns"):
        sgmv_expand(
            torch.zeros(2, 16).to(device), h, b.to(device), scales.to(device), rows, starts, slots, longest, 4
        )
