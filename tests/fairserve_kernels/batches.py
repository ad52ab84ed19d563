"""Builders of ragged paged-attention batches shared by the kernel tests and the GPU check."""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Cache slots no sequence owns hold this, so a kernel that reads them gives a visibly wrong answer.
POISON = 30.0


@dataclass
class PagedBatch:
    """One flat batch: queries, a filled paged K/V cache and the metadata that addresses it."""

    query: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    max_query_len: int
    max_seq_len: int


def make_batch(
    spans: list[tuple[int, int]],
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
    seed: int = 0,
    spare_blocks: int = 3,
) -> PagedBatch:
    """Build a batch from `(query_len, seq_len)` spans: (1, L) is a decode, (c, L > c) a chunk after L - c cached tokens.

    Physical blocks are handed out in a shuffled order (block tables are not contiguous), table rows
    are padded with -1, and slots no sequence owns are filled with POISON.
    """
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-seq_len // block_size) for _, seq_len in spans]
    num_blocks = sum(blocks_per_seq) + spare_blocks
    order = torch.randperm(num_blocks, generator=gen)
    width = max(max(blocks_per_seq, default=1), 1)
    tables = torch.full((len(spans), width), -1, dtype=torch.int32)
    k_cache = torch.full((num_blocks, block_size, num_kv_heads, head_dim), POISON)
    v_cache = torch.full((num_blocks, block_size, num_kv_heads, head_dim), POISON)
    used = 0
    for i, (_, seq_len) in enumerate(spans):
        n = blocks_per_seq[i]
        tables[i, :n] = order[used : used + n].int()
        used += n
        for pos in range(seq_len):
            block, offset = int(tables[i, pos // block_size]), pos % block_size
            k_cache[block, offset] = torch.randn(num_kv_heads, head_dim, generator=gen)
            v_cache[block, offset] = torch.randn(num_kv_heads, head_dim, generator=gen)
    q_lens = [q for q, _ in spans]
    starts = [0]
    for q in q_lens:
        starts.append(starts[-1] + q)
    query = torch.randn(starts[-1], num_heads, head_dim, generator=gen)
    return PagedBatch(
        query=query.to(dtype=dtype, device=device),
        k_cache=k_cache.to(dtype=dtype, device=device),
        v_cache=v_cache.to(dtype=dtype, device=device),
        block_tables=tables.to(device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        seq_lens=torch.tensor([s for _, s in spans], dtype=torch.int32, device=device),
        max_query_len=max(q_lens, default=0),
        max_seq_len=max((s for _, s in spans), default=0),
    )
