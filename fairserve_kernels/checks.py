"""Argument checks the Triton wrappers run before a launch, so bad input fails with a clear message."""

from __future__ import annotations

from typing import Any

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)


class KernelInputError(ValueError):
    """An argument a Triton kernel cannot be launched on; the message names the argument."""


def is_interpreted(kernel: Any) -> bool:
    """True when `kernel` was built by Triton's numpy interpreter (TRITON_INTERPRET=1 at import), which runs on CPU."""
    return type(kernel).__name__ == "InterpretedFunction"


def check_rank(name: str, tensor: torch.Tensor, rank: int) -> None:
    """Raise unless `tensor` has exactly `rank` dimensions."""
    if tensor.dim() != rank:
        raise KernelInputError(f"{name} must have {rank} dimensions, got shape {tuple(tensor.shape)}")


def check_dtype(name: str, tensor: torch.Tensor, allowed: tuple[torch.dtype, ...]) -> None:
    """Raise unless `tensor.dtype` is one of `allowed`."""
    if tensor.dtype not in allowed:
        names = ", ".join(str(d).removeprefix("torch.") for d in allowed)
        raise KernelInputError(
            f"{name} must be one of {names}, got {str(tensor.dtype).removeprefix('torch.')}"
        )


def check_unit_last_stride(name: str, tensor: torch.Tensor) -> None:
    """Raise unless the innermost (head_dim) dimension is contiguous, which the vectorised loads assume."""
    if tensor.numel() > 0 and tensor.shape[-1] > 1 and tensor.stride(-1) != 1:
        raise KernelInputError(
            f"{name} must be contiguous in its last dimension, got strides {tensor.stride()}"
        )


def check_same_device(tensors: dict[str, torch.Tensor], interpreted: bool) -> torch.device:
    """Raise unless all tensors share one device that Triton can run on; return that device."""
    devices = {name: t.device for name, t in tensors.items()}
    first_name, first = next(iter(devices.items()))
    for name, device in devices.items():
        if device != first:
            raise KernelInputError(f"{name} is on {device} but {first_name} is on {first}")
    if first.type == "cpu" and not interpreted:
        raise KernelInputError(
            "Triton kernels need CUDA tensors; got CPU tensors (use the torch backend on CPU, "
            "or set TRITON_INTERPRET=1 before the kernels are imported to run the interpreter)"
        )
    return first
