"""Torch twins of the Triton kernels: the CPU path of the engine and the oracle of the kernel tests.

Layouts (shared with the Triton kernels):
  key/value          [num_tokens, num_kv_heads, head_dim]
  k_cache/v_cache    [num_blocks, block_size, num_kv_heads, head_dim]
  slot_mapping       [num_tokens] int, block_id * block_size + offset, -1 = padding (skipped)
  query              [num_tokens, num_heads, head_dim], sequences laid end to end
  query_start_loc    [num_seqs + 1] int, offsets of each sequence's query span
  seq_lens           [num_seqs] int, context length of each sequence *including* its query span
  block_tables       [num_seqs, max_blocks] int, physical block of each logical block
A query at index i of a span of length q in a sequence of length L sits at position L - q + i and
attends to positions [max(0, pos - window + 1), pos].
"""

from __future__ import annotations

import torch


def store_kv_ref(
    key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Scatter new K/V rows into the paged cache at their slots, skipping slots < 0."""
    block_size = k_cache.shape[1]
    valid = slot_mapping >= 0
    slots = slot_mapping[valid].long()
    blocks, offsets = slots // block_size, slots % block_size
    k_cache[blocks, offsets] = key[valid].to(k_cache.dtype)
    v_cache[blocks, offsets] = value[valid].to(v_cache.dtype)


def _gather(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    block_size = cache.shape[1]
    num_blocks = (length + block_size - 1) // block_size
    rows = cache[block_table[:num_blocks].long()]  # [nb, bs, h, d]
    return rows.reshape(-1, cache.shape[2], cache.shape[3])[:length]


def _softcap(scores: torch.Tensor, soft_cap: float | None) -> torch.Tensor:
    if soft_cap is None or soft_cap <= 0:
        return scores
    return soft_cap * torch.tanh(scores / soft_cap)


def paged_attention_ref(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
) -> torch.Tensor:
    """Causal attention of each sequence's query span over its whole paged context, fp32 softmax.

    Decode spans (length 1) are batched into one padded matmul; prefill spans go one by one, so
    a mixed batch costs one batched call plus one call per prefill chunk.
    """
    num_heads, head_dim = query.shape[1], query.shape[2]
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.empty_like(query)
    qsl = query_start_loc.tolist()
    lens = seq_lens.tolist()
    decode_idx = [i for i in range(len(lens)) if qsl[i + 1] - qsl[i] == 1]
    decode_set = set(decode_idx)
    if decode_idx:
        _decode_batch(query, k_cache, v_cache, block_tables, qsl, lens, decode_idx, scale, sliding_window, soft_cap, group, out)
    for i, length in enumerate(lens):
        start, end = qsl[i], qsl[i + 1]
        if end == start or i in decode_set:
            continue
        q = query[start:end].float()  # [q, H, D]
        k = _gather(k_cache, block_tables[i], length).float().repeat_interleave(group, dim=1)
        v = _gather(v_cache, block_tables[i], length).float().repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) * scale
        scores = _softcap(scores, soft_cap)
        qpos = torch.arange(length - (end - start), length).unsqueeze(1)
        kpos = torch.arange(length).unsqueeze(0)
        mask = kpos > qpos
        if sliding_window is not None and sliding_window > 0:
            mask |= kpos <= qpos - sliding_window
        scores.masked_fill_(mask.unsqueeze(0), float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[start:end] = torch.einsum("hqk,khd->qhd", probs, v).to(query.dtype)
    return out.view(-1, num_heads, head_dim)


def _decode_batch(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    qsl: list[int],
    lens: list[int],
    idx: list[int],
    scale: float,
    sliding_window: int | None,
    soft_cap: float | None,
    group: int,
    out: torch.Tensor,
) -> None:
    block_size = k_cache.shape[1]
    max_len = max(lens[i] for i in idx)
    nb = (max_len + block_size - 1) // block_size
    sel = torch.tensor(idx)
    tables = block_tables[sel, :nb].long()  # [B, nb]
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    b = len(idx)
    k = k_cache[tables].reshape(b, nb * block_size, num_kv_heads, head_dim).float()
    v = v_cache[tables].reshape(b, nb * block_size, num_kv_heads, head_dim).float()
    rows = torch.tensor([qsl[i] for i in idx])
    q = query[rows].float().view(b, num_kv_heads, group, head_dim)
    scores = torch.einsum("bgqd,bkgd->bgqk", q, k) * scale  # [B, Hkv, group, L]
    scores = _softcap(scores, soft_cap)
    lengths = torch.tensor([lens[i] for i in idx]).view(b, 1, 1, 1)
    kpos = torch.arange(nb * block_size).view(1, 1, 1, -1)
    mask = kpos >= lengths
    if sliding_window is not None and sliding_window > 0:
        mask |= kpos <= (lengths - 1) - sliding_window
    scores.masked_fill_(mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    res = torch.einsum("bgqk,bkgd->bgqd", probs, v).reshape(b, -1, head_dim)
    out[rows] = res.to(out.dtype)
