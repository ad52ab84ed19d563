"""A step's inputs as the host builds them (`HostBatch`), from the scheduler's chunks and the block tables.

Two builders: any mix of prefill chunks and decodes (`chunks_batch`, per-chunk tensors and no loop over
tokens), and the decode steady state, every chunk one token (`one_token_each_batch`, one pass and numpy,
where each torch call's fixed cost would dominate). The model runner (engine/worker/model_runner.py) adds the
sliding-window layout, LoRA segments, forked choices' rows and block copies, then moves it to the device.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from engine.core.request import Request
from engine.core.scheduler import SchedulerOutput
from engine.worker.lora.batch import LoraSegments
from engine.worker.lora.stack import LoraStack


def _token_slice(request: Request, start: int, end: int) -> list[int]:
    """Tokens [start, end) of prompt + output, without concatenating the whole sequence."""
    prompt = request.prompt_token_ids
    n = len(prompt)
    if start >= n:
        return request.output_token_ids[start - n : end - n]
    if end <= n:
        return prompt[start:end]
    return prompt[start:] + request.output_token_ids[: end - n]


@dataclass
class HostBatch:
    """A batch's inputs built on the host, before they go to the device: what `ModelRunner.run` needs."""

    ids: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    table: torch.Tensor
    starts: torch.Tensor
    seq_lens: torch.Tensor
    max_query_len: int
    sample_rows: list[int]
    sampling: list[Request]  # the requests of `sample_rows`, fixed here (the scheduler moves on meanwhile)
    placeholders: bool  # some ids are still in flight (async scheduling): -(1 + row of the previous samples)
    window_slots: torch.Tensor | None = (
        None  # the sliding-window group's layout (engine/worker/window_cache.py)
    )
    window_table: torch.Tensor | None = None
    # LoRA (engine/worker/lora/batch.py): the adapted rows as sorted segments per slot; None when no row has one.
    lora_groups: LoraSegments | None = None
    # The slot stacks those segments index, as they were when the step was built (a later step may grow
    # them into a new stack: engine/worker/lora/resident.py).
    lora_stack: LoraStack | None = None
    # (shared, fresh) KV blocks copied before the forward (copy on write: engine/worker/kv_copy.py).
    block_copies: list[tuple[int, int]] = field(default_factory=list)


def chunks_batch(out: SchedulerOutput, table_t: torch.Tensor, block_size: int) -> HostBatch:
    """Any mix of prefill chunks and decodes."""
    chunks = out.chunks
    token_ids: list[int] = []
    for chunk in chunks:
        token_ids.extend(_token_slice(chunk.request, chunk.start, chunk.start + chunk.length))
    # Per-token positions and slots come from per-chunk tensors (no Python loop over tokens).
    chunk_starts = torch.tensor([c.start for c in chunks], dtype=torch.int64)
    lengths = torch.tensor([c.length for c in chunks], dtype=torch.int64)
    ends = torch.cumsum(lengths, 0)
    seq_of_token = torch.repeat_interleave(torch.arange(len(chunks)), lengths)
    positions = torch.arange(len(token_ids)) + (chunk_starts - ends + lengths)[seq_of_token]
    bs = block_size
    slots = table_t[seq_of_token, positions // bs].long() * bs + positions % bs
    starts = torch.zeros(len(chunks) + 1, dtype=torch.int32)
    starts[1:] = ends
    seq_lens = (chunk_starts + lengths).to(torch.int32)
    ends_list = ends.tolist()
    sample_rows = [e - 1 for e, c in zip(ends_list, chunks, strict=True) if c.samples]
    ids_t = torch.tensor(token_ids, dtype=torch.int64)
    return HostBatch(
        ids_t,
        positions,
        slots,
        table_t,
        starts,
        seq_lens,
        max((c.length for c in chunks), default=0),
        sample_rows,
        [c.request for c in chunks if c.samples],
        min(token_ids, default=0) < 0,
    )


def one_token_each_batch(out: SchedulerOutput, table: np.ndarray, block_size: int) -> HostBatch:
    """The decode steady state (every chunk one token): one pass over the chunks, then numpy on arrays
    of a few hundred entries, where each torch call's fixed cost (microseconds) would dominate."""
    token_ids, positions_l, sample_rows, sampling = [], [], [], []
    for row, chunk in enumerate(out.chunks):
        request, start = chunk.request, chunk.start
        prompt, output = request.prompt_token_ids, request.output_token_ids
        n = len(prompt)
        token_ids.append(output[start - n] if start >= n else prompt[start])
        positions_l.append(start)
        if start + 1 == n + len(output):
            sample_rows.append(row)
            sampling.append(request)
    positions = np.array(positions_l, dtype=np.int64)
    bs = block_size
    slots = table[np.arange(len(positions_l)), positions // bs].astype(np.int64) * bs + positions % bs
    starts = np.arange(len(token_ids) + 1, dtype=np.int32)
    seq_lens = (positions + 1).astype(np.int32)
    ids = np.array(token_ids, dtype=np.int64)
    from_numpy = torch.from_numpy
    return HostBatch(
        from_numpy(ids),
        from_numpy(positions),
        from_numpy(slots),
        from_numpy(table),
        from_numpy(starts),
        from_numpy(seq_lens),
        1,
        sample_rows,
        sampling,
        bool(len(ids)) and int(ids.min()) < 0,
    )
