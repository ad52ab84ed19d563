"""Kernel tests run the Triton kernels on CUDA when present, else in Triton's numpy interpreter on CPU.

TRITON_INTERPRET is read when a kernel is decorated (at import of fairserve_kernels.triton_*, and of Triton's
own library at `import triton`), so tests/conftest.py sets it for the whole session on a machine without
CUDA; it is set here too, for a run of this directory alone, and kernel modules imported earlier without it
are reloaded.
"""

from __future__ import annotations

import importlib
import os
import sys

import pytest
import torch

ON_CUDA = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
if not ON_CUDA:
    os.environ["TRITON_INTERPRET"] = "1"
    for name in [n for n in sys.modules if n.startswith("fairserve_kernels.triton_")]:
        importlib.reload(sys.modules[name])
    if "engine.worker.kernels" in sys.modules:  # its Triton table holds the kernels as first imported
        sys.modules["engine.worker.kernels"].clear_cache()

KERNEL_DEVICE = torch.device("cuda") if ON_CUDA else torch.device("cpu")


@pytest.fixture
def device() -> torch.device:
    """Where the kernel tests put their tensors: CUDA, or CPU for the interpreter."""
    return KERNEL_DEVICE
