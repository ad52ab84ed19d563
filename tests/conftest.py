"""Settings every test process needs before any test module is imported.

Triton decides between its compiler and its numpy interpreter when a `@triton.jit` function is decorated,
and its own standard library (`tl.max`, `tl.sum`, `tl.cdiv`, ...) is decorated at `import triton`. A test
module of any directory may import Triton first: `torch._dynamo` does, and peft (the LoRA tests) imports
that. Triton then holds compiled-mode library functions, which an interpreted kernel cannot call ("Cannot
call @triton.jit'd outside of the scope of a kernel"). So on a machine without CUDA the whole session runs
the interpreter, set here at the first conftest import. The compile gate runs in a subprocess without it
(tests/fairserve_kernels/test_compile_gate.py); the engine's backend is chosen by its config, not by this.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
