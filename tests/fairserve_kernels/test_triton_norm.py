"""Triton RMSNorm (alone and fused with the residual add) against its torch twin."""

from __future__ import annotations

import pytest
import torch

from fairserve_kernels.checks import KernelInputError
from fairserve_kernels.layer_reference import fused_add_rms_norm_ref, rms_norm_ref
from fairserve_kernels.triton_norm import MAX_WIDTH, fused_add_rms_norm, rms_norm

TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3}


def _close(got: torch.Tensor, expected: torch.Tensor) -> None:
    assert got.dtype == expected.dtype and got.shape == expected.shape
    tol = TOLERANCE[expected.dtype]
    torch.testing.assert_close(got.cpu(), expected, atol=tol, rtol=tol)


def _weight(width: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    return (1.0 + 0.3 * torch.randn(width, generator=gen)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("width", [32, 80, 256, 1000])
@pytest.mark.parametrize("unit_offset", [False, True])
def test_fused_add_rms_norm_matches_twin(
    device: torch.device, dtype: torch.dtype, width: int, unit_offset: bool
) -> None:
    gen = torch.Generator().manual_seed(width)
    x = (3 * torch.randn(7, width, generator=gen)).to(dtype)
    residual = torch.randn(7, width, generator=gen).to(dtype)
    weight = _weight(width, dtype, gen)
    expected, expected_sum = fused_add_rms_norm_ref(x, residual, weight, 1e-6, unit_offset)
    x_dev, r_dev = x.to(device), residual.to(device)
    got, got_sum = fused_add_rms_norm(x_dev, r_dev, weight.to(device), 1e-6, unit_offset)
    _close(got, expected)
    # The new residual is the sum rounded to the activation dtype, exactly as the model's own add.
    assert torch.equal(got_sum.cpu(), expected_sum)
    assert torch.equal(x_dev.cpu(), x) and torch.equal(r_dev.cpu(), residual), "inputs were modified"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("unit_offset", [False, True])
def test_rms_norm_matches_twin(device: torch.device, dtype: torch.dtype, unit_offset: bool) -> None:
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(5, 96, generator=gen).to(dtype)
    weight = _weight(96, dtype, gen)
    _close(
        rms_norm(x.to(device), weight.to(device), 1e-5, unit_offset),
        rms_norm_ref(x, weight, 1e-5, unit_offset),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_head_norm_over_a_strided_slice_of_merged_qkv(device: torch.device, dtype: torch.dtype) -> None:
    """Qwen3's and Gemma 3's q/k norms: each head of a [T, Hq + 2Hkv, D] view normed on its own."""
    gen = torch.Generator().manual_seed(5)
    qkv = torch.randn(6, 4 + 2 + 2, 64, generator=gen).to(dtype)
    weight = _weight(64, dtype, gen)
    q, k = qkv[:, :4], qkv[:, 4:6]
    assert not q.is_contiguous() and not k.is_contiguous()
    qkv_dev, w_dev = qkv.to(device), weight.to(device)
    for unit_offset in (False, True):
        _close(rms_norm(qkv_dev[:, :4], w_dev, 1e-6, unit_offset), rms_norm_ref(q, weight, 1e-6, unit_offset))
        _close(
            rms_norm(qkv_dev[:, 4:6], w_dev, 1e-6, unit_offset), rms_norm_ref(k, weight, 1e-6, unit_offset)
        )


def test_every_row_is_normalised_to_unit_rms(device: torch.device) -> None:
    """Independent of the twin: with weight 1, each row's root mean square is 1 whatever its scale."""
    scales = torch.tensor([1e-3, 1.0, 1e3])[:, None]
    x = torch.randn(3, 128, generator=torch.Generator().manual_seed(9)) * scales
    out = rms_norm(x.to(device), torch.ones(128, device=device), 0.0).cpu()
    torch.testing.assert_close(out.pow(2).mean(-1), torch.ones(3), atol=1e-5, rtol=1e-5)


def test_empty_batch(device: torch.device) -> None:
    x = torch.empty(0, 64, device=device)
    out, summed = fused_add_rms_norm(x, x, torch.ones(64, device=device), 1e-6)
    assert out.shape == summed.shape == (0, 64)


@pytest.mark.parametrize(
    ("shapes", "message"),
    [
        (((4, MAX_WIDTH + 1), (MAX_WIDTH + 1,)), "rows must hold"),
        (((4, 64), (32,)), "weight must be"),
        (((4,), (4,)), "x must be"),
    ],
)
def test_bad_arguments_are_named(
    device: torch.device, shapes: tuple[tuple[int, ...], tuple[int, ...]], message: str
) -> None:
    x_shape, w_shape = shapes
    with pytest.raises(KernelInputError, match=message):
        rms_norm(torch.zeros(x_shape, device=device), torch.ones(w_shape, device=device), 1e-6)


def test_mismatched_residual_is_refused(device: torch.device) -> None:
    x = torch.zeros(4, 64, device=device)
    with pytest.raises(KernelInputError, match="residual"):
        fused_add_rms_norm(x, x.half(), torch.ones(64, device=device), 1e-6)
    with pytest.raises(KernelInputError, match="residual"):
        fused_add_rms_norm(x, torch.zeros(3, 64, device=device), torch.ones(64, device=device), 1e-6)
