"""The batched LoRA delta of one (possibly fused) projection: y[rows] += scale * (x[rows] @ A^T) @ B^T.

One path over the slot stacks (engine/worker/lora/stack.py) for every adapter of the step: per targeted
module, a segmented shrink (x @ A^T, float32, ranks padded to the stack's r_max) and a segmented
expand (scaled, added into that module's columns of the fused output). `ops` picks the Triton SGMV
kernels (fairserve_kernels/triton_lora.py) or their torch twins (fairserve_kernels/lora_reference.py),
like every other kernel of the forward (engine/worker/kernels.py).
"""

from __future__ import annotations

import torch

from engine.worker.kernels import Kernels
from engine.worker.lora.batch import LoraBatch

# (HF module name, first output column, width): where each module sits in a fused projection's output.
Slices = tuple[tuple[str, int, int], ...]


def add_lora(
    out: torch.Tensor, x: torch.Tensor, batch: LoraBatch, layer: int, slices: Slices, ops: Kernels
) -> None:
    """Add every adapted row's delta for the modules of `slices` into `out` ([N, width]) in place; x: [N, d_in]."""
    seg = batch.segments
    for module, start, _width in slices:
        stack = batch.stack.get(layer, module)
        if stack is None:
            continue
        h = ops.lora_shrink(x, stack.a, seg.rows, seg.seg_starts, seg.seg_slots, seg.max_seg_len)
        ops.lora_expand(
            out,
            h,
            stack.b,
            batch.stack.scales,
            seg.rows,
            seg.seg_starts,
            seg.seg_slots,
            seg.max_seg_len,
            start,
        )
