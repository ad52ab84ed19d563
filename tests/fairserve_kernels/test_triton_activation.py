"""Triton act-and-mul (SiLU, tanh-GELU) against its torch twin."""

from __future__ import annotations

import pytest
import torch

from fairserve_kernels.checks import KernelInputError
from fairserve_kernels.layer_reference import GATED_ACTIVATIONS, act_and_mul_ref
from fairserve_kernels.triton_activation import BLOCK, act_and_mul

TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-3}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("activation", GATED_ACTIVATIONS)
@pytest.mark.parametrize("inter", [1, 100, BLOCK + 76])
def test_matches_twin(device: torch.device, dtype: torch.dtype, activation: str, inter: int) -> None:
    gen = torch.Generator().manual_seed(inter)
    # Wide range: saturated tails of both activations, and the region around zero.
    x = (4 * torch.randn(5, 2 * inter, generator=gen)).to(dtype)
    expected = act_and_mul_ref(x, activation)
    got = act_and_mul(x.to(device), activation)
    assert got.shape == (5, inter) and got.dtype == dtype
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(got.cpu(), expected, atol=tol, rtol=tol)


def test_strided_rows(device: torch.device) -> None:
    """A row-strided [N, 2I] view (the gate/up GEMM's output sliced) reads each row from its own start."""
    x = torch.randn(4, 300, generator=torch.Generator().manual_seed(4))
    view = x[:, :200]
    got = act_and_mul(x.to(device)[:, :200]).cpu()
    torch.testing.assert_close(got, act_and_mul_ref(view), atol=1e-6, rtol=1e-6)


def test_bad_arguments_are_named(device: torch.device) -> None:
    with pytest.raises(KernelInputError, match="activation must be"):
        act_and_mul(torch.zeros(2, 8, device=device), "relu")
    with pytest.raises(KernelInputError, match="equal width"):
        act_and_mul(torch.zeros(2, 7, device=device))
    with pytest.raises(KernelInputError, match="x must have 2 dimensions"):
        act_and_mul(torch.zeros(8, device=device))
