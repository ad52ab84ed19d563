"""Torch segmented LoRA GEMMs (shrink, expand): the CPU path of adapted projections and the Triton twin's oracle.

Layouts (shared with fairserve_kernels/triton_lora.py). A step's adapted token rows come as sorted
segments, one per adapter slot in the step: rows not in any segment (requests without an adapter)
are neither read nor written.
  x           [num_tokens, d_in]          the projection's input
  a           [slots, r_max, d_in]        A of every slot, ranks zero-padded to r_max
  b           [slots, d_out, r_max]       B of every slot
  scales      [slots] float32             each slot's alpha / r
  rows        [M] int                     token indices, grouped by slot (segment s: seg_starts[s]..[s+1])
  seg_starts  [S + 1] int                 segment boundaries in `rows`
  seg_slots   [S] int                     each segment's slot
  h           [M, r_max] float32          shrink's output, row i for token rows[i]
  out         [num_tokens, width]         expand adds into columns col_start .. col_start + d_out
`max_seg_len` (a host int, the longest segment) sizes the Triton grid; the twin ignores it. The twin
loops over the segments, or, when they are many and short (decode), gathers each row's slot weights
and runs one batched matmul (`_row_slots`).
"""

from __future__ import annotations

import torch

# The gathered path (below) copies each row's slot weights: [M, r_max, d] elements, bounded here.
GATHER_LIMIT = 1 << 23


def _segments(seg_starts: torch.Tensor, seg_slots: torch.Tensor) -> list[tuple[int, int, int]]:
    """(slot, start, end) of every non-empty segment, read on the host."""
    starts = seg_starts.tolist()
    return [
        (s, starts[i], starts[i + 1]) for i, s in enumerate(seg_slots.tolist()) if starts[i + 1] > starts[i]
    ]


def _row_slots(
    rows: torch.Tensor, seg_starts: torch.Tensor, seg_slots: torch.Tensor, width: int, r_max: int
) -> torch.Tensor | None:
    """Each row's slot when segments are short (decode: a row or a few per adapter) and the gathered
    weights are small; None to loop over the segments instead (prefill: long runs of one slot).

    With many short segments the loop's dozen small ops per segment dominate a step (64 adapters: most
    of it); one gather of the rows' weights and a batched matmul do the same arithmetic in a few ops.
    """
    segments, num_rows = seg_slots.numel(), rows.numel()
    if segments < 2 or num_rows > 4 * segments or num_rows * r_max * width > GATHER_LIMIT:
        return None
    return torch.repeat_interleave(seg_slots.long(), torch.diff(seg_starts.long()), output_size=num_rows)


def lora_shrink_ref(
    x: torch.Tensor,
    a: torch.Tensor,
    rows: torch.Tensor,
    seg_starts: torch.Tensor,
    seg_slots: torch.Tensor,
    max_seg_len: int,
) -> torch.Tensor:
    """h[i] = x[rows[i]] @ a[slot of i]^T in float32: each segment's rows through its slot's A."""
    row_slots = _row_slots(rows, seg_starts, seg_slots, a.shape[2], a.shape[1])
    if row_slots is not None:
        picked = x.index_select(0, rows).float()
        return torch.bmm(a.index_select(0, row_slots).float(), picked[:, :, None])[:, :, 0]
    h = torch.zeros(rows.numel(), a.shape[1], dtype=torch.float32, device=x.device)
    for slot, start, end in _segments(seg_starts, seg_slots):
        picked = x.index_select(0, rows[start:end])
        h[start:end] = picked.float() @ a[slot].float().t()
    return h


def lora_expand_ref(
    out: torch.Tensor,
    h: torch.Tensor,
    b: torch.Tensor,
    scales: torch.Tensor,
    rows: torch.Tensor,
    seg_starts: torch.Tensor,
    seg_slots: torch.Tensor,
    max_seg_len: int,
    col_start: int,
) -> None:
    """out[rows[i], col_start:+d_out] += scales[slot] * h[i] (rounded to b's dtype) @ b[slot]^T, in place.

    The sum is taken in float32 and rounded once to out's dtype, as the kernel does.
    """
    target = out[:, col_start : col_start + b.shape[1]]
    row_slots = _row_slots(rows, seg_starts, seg_slots, b.shape[1], b.shape[2])
    if row_slots is not None:
        picked = rows.long()
        weights = b.index_select(0, row_slots).float()
        delta = torch.bmm(weights, h.to(b.dtype).float()[:, :, None])[:, :, 0] * scales[row_slots][:, None]
        target.index_copy_(0, picked, (target.index_select(0, picked).float() + delta).to(out.dtype))
        return
    for slot, start, end in _segments(seg_starts, seg_slots):
        picked = rows[start:end].long()
        delta = (h[start:end].to(b.dtype).float() @ b[slot].float().t()) * scales[slot]
        target.index_copy_(0, picked, (target.index_select(0, picked).float() + delta).to(out.dtype))
