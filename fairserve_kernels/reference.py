"""Torch twins of the Triton kernels: the CPU path of the engine and the oracle of the kernel tests.

Layouts (shared with the Triton kernels):
  key/value          [num_tokens, num_kv_heads, head_dim]
  k_cache/v_cache    [num_blocks, block_size, num_kv_heads, head_dim]
  slot_mapping       [num_tokens] int, block_id * block_size + offset, -1 = padding (skipped)
  query              [num_tokens, num_heads, head_dim], sequences laid end to end
  query_start_loc    [num_seqs + 1] int, offsets of each sequence's query span
  seq_lens           [num_seqs] int, context length of each sequence *including* its query span
  block_tables       [num_seqs, max_blocks] int, physical block of each logical block (-1 = unused)
A query at index i of a span of length q in a sequence of length L sits at position L - q + i and
attends to positions [max(0, pos - window + 1), pos]. A one-token span with seq_len 0 is a padding row
(a CUDA graph's batch padded to its bucket, engine/worker/decode_graphs.py): it attends to nothing, output 0.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# A decode bucket closes when the next (shorter) sequence needs less than this fraction of the
# bucket's longest context, so padding wastes at most about 1 / fraction of the gathered K/V.
_BUCKET_FRACTION = 0.5


def store_kv_ref(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Scatter new K/V rows into the paged cache at their slots, skipping slots < 0."""
    slots = slot_mapping.long()
    if bool((slots < 0).any()):
        valid = slots >= 0
        slots, key, value = slots[valid], key[valid], value[valid]
    # index_copy_ on the flat slot view is a plain row copy; two-tensor advanced indexing is ~100x slower.
    for cache, rows in ((k_cache, key), (v_cache, value)):
        if cache.is_contiguous():
            cache.view(-1, *cache.shape[2:]).index_copy_(0, slots, rows.to(cache.dtype))
        else:
            block_size = cache.shape[1]
            cache[slots // block_size, slots % block_size] = rows.to(cache.dtype)


def _gather(cache: torch.Tensor, tables: torch.Tensor, num_blocks: int) -> torch.Tensor:
    """[B, nb] block tables -> [B, Hkv, nb * block_size, D] float32 K or V (a strided view when fp32)."""
    b = tables.shape[0]
    idx = tables[:, :num_blocks].clamp(min=0).reshape(-1).long()  # -1 padding is masked out anyway
    rows = cache.index_select(0, idx).view(b, num_blocks * cache.shape[1], cache.shape[2], cache.shape[3])
    return rows.float().transpose(1, 2)


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    allowed: torch.Tensor,
    scale: float,
    soft_cap: float | None,
) -> torch.Tensor:
    """q [B, Hkv, R, D], k/v [B, Hkv, L, D], allowed: bool broadcastable to [B, Hkv, R, L]; fp32 softmax."""
    if soft_cap is None or soft_cap <= 0:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scale)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    scores = soft_cap * torch.tanh(scores / soft_cap)
    scores.masked_fill_(~allowed, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def _allowed(qpos: torch.Tensor, kpos: torch.Tensor, sliding_window: int | None) -> torch.Tensor:
    """Which key positions each query position may attend to (causal, optional window)."""
    mask = kpos <= qpos
    if sliding_window is not None and sliding_window > 0:
        mask &= kpos > qpos - sliding_window
    return mask


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

    Decode spans (length 1) are sorted by context length and batched into a few padded calls;
    prefill spans go one by one, with the query heads of a KV group stacked into one matrix.
    """
    num_heads, head_dim = query.shape[1], query.shape[2]
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    block_size = k_cache.shape[1]
    out = torch.empty_like(query)
    qsl = query_start_loc.tolist()
    lens = seq_lens.tolist()
    ones = [i for i in range(len(lens)) if qsl[i + 1] - qsl[i] == 1]
    padding = [qsl[i] for i in ones if lens[i] == 0]
    if padding:
        out.index_fill_(0, torch.tensor(padding, device=query.device), 0.0)
    decodes = sorted((i for i in ones if lens[i] > 0), key=lambda i: -lens[i])
    for bucket in _buckets(decodes, lens):
        nb = -(-lens[bucket[0]] // block_size)
        # index_select/index_copy_ rather than tensor indexing: the latter is far slower on CPU.
        tables = block_tables.index_select(0, torch.tensor(bucket, device=query.device))
        k = _gather(k_cache, tables, nb)
        v = _gather(v_cache, tables, nb)
        rows = torch.tensor([qsl[i] for i in bucket], device=query.device)
        q = query.index_select(0, rows).float().view(len(bucket), num_kv_heads, group, head_dim)
        last = torch.tensor([lens[i] - 1 for i in bucket], device=query.device).view(-1, 1, 1, 1)
        kpos = torch.arange(nb * block_size, device=query.device).view(1, 1, 1, -1)
        res = _attend(q, k, v, _allowed(last, kpos, sliding_window), scale, soft_cap)
        out.index_copy_(0, rows, res.reshape(len(bucket), num_heads, head_dim).to(out.dtype))
    for i, length in enumerate(lens):
        start, end = qsl[i], qsl[i + 1]
        span = end - start
        if span <= 1:
            continue
        nb = -(-length // block_size)
        k = _gather(k_cache, block_tables[i : i + 1], nb)
        v = _gather(v_cache, block_tables[i : i + 1], nb)
        # [span, H, D] -> [1, Hkv, group * span, D]: one matrix per KV head, rows ordered (g, i).
        q = query[start:end].float().view(span, num_kv_heads, group, head_dim).permute(1, 2, 0, 3)
        q = q.reshape(1, num_kv_heads, group * span, head_dim)
        qpos = torch.arange(length - span, length, device=query.device).repeat(group).unsqueeze(1)
        kpos = torch.arange(nb * block_size, device=query.device).unsqueeze(0)
        allowed = _allowed(qpos, kpos, sliding_window)
        res = _attend(q, k, v, allowed, scale, soft_cap)  # [1, Hkv, group * span, D]
        res = (
            res.view(num_kv_heads, group, span, head_dim)
            .permute(2, 0, 1, 3)
            .reshape(span, num_heads, head_dim)
        )
        out[start:end] = res.to(query.dtype)
    return out.view(-1, num_heads, head_dim)


def _buckets(order: list[int], lens: list[int]) -> list[list[int]]:
    """Split sequences sorted by descending length into runs of similar length."""
    buckets: list[list[int]] = []
    for i in order:
        if buckets and lens[i] >= _BUCKET_FRACTION * lens[buckets[-1][0]]:
            buckets[-1].append(i)
        else:
            buckets.append([i])
    return buckets
