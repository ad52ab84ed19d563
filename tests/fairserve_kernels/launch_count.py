"""Counting, on CPU, the GPU kernels a piece of code would launch: torch ops that run a kernel (seen by a
TorchDispatchMode) and Triton launches (the interpreter's, counted at their entry; the torch work the
interpreter does inside one to move tensors is not counted). Also lists the ops that wait for the device
(a scalar read, `nonzero`, masked selects): a CUDA graph cannot capture them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from triton.runtime.interpreter import InterpretedFunction

aten = torch.ops.aten
# Ops that allocate or describe and launch nothing (views are recognised by their schema).
NO_KERNEL = {
    aten.empty.memory_format,
    aten.empty_strided.default,
    aten.empty_like.default,
    aten.detach.default,
    aten.lift_fresh.default,
    aten.sym_size.int,
    aten.sym_stride.int,
    aten.sym_numel.default,
    aten.sym_storage_offset.default,
    aten.is_same_size.default,
}
# Ops whose result the host needs before it can go on: each a device -> host sync.
HOST_SYNC = {
    aten._local_scalar_dense.default,  # .item(), int(t), float(t), bool(t)
    aten.nonzero.default,
    aten.nonzero_static.default,
    aten.masked_select.default,
    aten.is_nonzero.default,
    aten.equal.default,
    aten.unique_consecutive.default,
    aten._unique2.default,
    aten.repeat_interleave.Tensor,
}


class LaunchCount(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Kernels launched while active: torch ops by name, Triton kernels by name, and host syncs."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.torch_ops: Counter[str] = Counter()
        self.triton: Counter[str] = Counter()
        self.syncs: list[str] = []
        self.inside_triton = False

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if not self.inside_triton:
            if func in HOST_SYNC:
                self.syncs.append(str(func))
            if func not in NO_KERNEL and not func.is_view and func not in HOST_SYNC:
                self.torch_ops[str(func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.torch_ops.values()) + sum(self.triton.values())


@contextmanager
def counting() -> Iterator[LaunchCount]:
    """Count within; Triton launches are the interpreter's (TRITON_INTERPRET=1, the CPU test runs)."""
    count = LaunchCount()
    run = InterpretedFunction.run

    def counted(self: InterpretedFunction[Any], *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("warmup"):
            return run(self, *args, **kwargs)
        count.triton[self.fn.__name__] += 1
        count.inside_triton = True
        try:
            return run(self, *args, **kwargs)
        finally:
            count.inside_triton = False

    InterpretedFunction.run = counted
    try:
        # Out of inference mode (autograd still off): within it `Tensor.to` casts do not reach a dispatch mode.
        with count, torch.inference_mode(False), torch.no_grad():
            yield count
    finally:
        InterpretedFunction.run = run
