"""The batched LoRA delta, torch twin: for each adapter's rows, y[rows] += scale * (x[rows] @ A^T) @ B^T.

A segmented matmul in torch: one gather of the rows per adapter and projection group, two small GEMMs
per targeted module, one index_add into that module's columns of the (possibly fused) output. This is
the CPU path and, for now, the CUDA one too; a Triton SGMV/BGMV kernel (one launch for all adapters)
is left for later (docs/engine.md, "LoRA adapters").
"""

from __future__ import annotations

import torch

from engine.lora.batch import LoraBatch

# (HF module name, first output column, width): where each module sits in a fused projection's output.
Slices = tuple[tuple[str, int, int], ...]


def add_lora(out: torch.Tensor, x: torch.Tensor, batch: LoraBatch, layer: int, slices: Slices) -> None:
    """Add each adapter's delta for the modules of `slices` into `out` ([N, width]) in place; x: [N, d_in]."""
    for adapter, rows in batch.groups:
        picked: torch.Tensor | None = None
        for module, start, width in slices:
            pair = adapter.weights.get((layer, module))
            if pair is None:
                continue
            if picked is None:
                picked = x.index_select(0, rows)
            a, b = pair
            delta = (picked @ a.t()).mul_(adapter.scale) @ b.t()
            out[:, start : start + width].index_add_(0, rows, delta.to(out.dtype))
