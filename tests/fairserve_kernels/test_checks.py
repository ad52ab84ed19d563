"""Argument checks shared by the Triton wrappers."""

from __future__ import annotations

import pytest
import torch

from fairserve_kernels.checks import KernelInputError, check_same_device, is_interpreted
from fairserve_kernels.triton_store import _store_kv_kernel


def test_cpu_tensors_are_refused_for_compiled_kernels() -> None:
    with pytest.raises(KernelInputError, match="need CUDA tensors"):
        check_same_device({"query": torch.zeros(1)}, interpreted=False)


def test_cpu_tensors_are_accepted_by_the_interpreter() -> None:
    assert (
        check_same_device({"query": torch.zeros(1), "k_cache": torch.zeros(2)}, interpreted=True).type
        == "cpu"
    )


def test_mixed_devices_are_refused() -> None:
    with pytest.raises(KernelInputError, match="k_cache is on meta but query is on cpu"):
        check_same_device(
            {"query": torch.zeros(1), "k_cache": torch.zeros(1, device="meta")}, interpreted=True
        )


def test_interpreter_detection_matches_the_test_device(device: torch.device) -> None:
    assert is_interpreted(_store_kv_kernel) == (device.type == "cpu")
