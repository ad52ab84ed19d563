"""The torch reference (the CPU engine path and the Triton tests' oracle) against a naive per-query loop."""

from __future__ import annotations

import math
import random

import pytest
import torch

from fairserve_kernels.reference import paged_attention_ref, store_kv_ref


def naive(
    query: torch.Tensor,
    keys: list[torch.Tensor],
    values: list[torch.Tensor],
    spans: list[int],
    scale: float,
    window: int | None,
    soft_cap: float | None,
) -> torch.Tensor:
    """One query at a time, one key at a time: the definition, with nothing batched or paged."""
    out = torch.zeros_like(query, dtype=torch.float64)
    row = 0
    group = query.shape[1] // keys[0].shape[1]
    for k, v, q_len in zip(keys, values, spans, strict=True):
        length = k.shape[0]
        for i in range(q_len):
            pos = length - q_len + i
            for h in range(query.shape[1]):
                kv = h // group
                scores = []
                for j in range(pos + 1):
                    if window is not None and j <= pos - window:
                        scores.append(-math.inf)
                        continue
                    s = float(query[row, h].double() @ k[j, kv].double()) * scale
                    if soft_cap:
                        s = soft_cap * math.tanh(s / soft_cap)
                    scores.append(s)
                probs = torch.softmax(torch.tensor(scores, dtype=torch.float64), dim=0)
                out[row, h] = probs @ v[: pos + 1, kv].double()
            row += 1
    return out


@pytest.mark.parametrize(
    ("window", "soft_cap", "heads", "kv_heads"),
    [(None, None, 4, 2), (5, None, 4, 4), (None, 20.0, 6, 2), (7, 30.0, 2, 1)],
)
def test_reference_matches_naive_definition(
    window: int | None, soft_cap: float | None, heads: int, kv_heads: int
) -> None:
    rng = random.Random(0)
    torch.manual_seed(0)
    block_size, head_dim, num_blocks = 4, 8, 40
    # (context length, query span): decodes, a fresh prefill and a chunk with prior context.
    seqs = [(9, 1), (3, 1), (13, 13), (17, 5), (1, 1)]
    k_cache = torch.zeros(num_blocks, block_size, kv_heads, head_dim)
    v_cache = torch.zeros_like(k_cache)
    free = list(range(num_blocks))
    rng.shuffle(free)
    tables, keys, values, queries = [], [], [], []
    for length, span in seqs:
        blocks = [free.pop() for _ in range(-(-length // block_size))]
        tables.append(blocks)
        k, v = torch.randn(length, kv_heads, head_dim), torch.randn(length, kv_heads, head_dim)
        slots = torch.tensor([blocks[p // block_size] * block_size + p % block_size for p in range(length)])
        store_kv_ref(k, v, k_cache, v_cache, slots)
        keys.append(k)
        values.append(v)
        queries.append(torch.randn(span, heads, head_dim))
    width = max(len(t) for t in tables)
    block_tables = torch.tensor([t + [-1] * (width - len(t)) for t in tables], dtype=torch.int32)
    starts = [0]
    for _, span in seqs:
        starts.append(starts[-1] + span)
    query = torch.cat(queries)
    scale = head_dim**-0.5
    got = paged_attention_ref(
        query,
        k_cache,
        v_cache,
        block_tables,
        torch.tensor(starts, dtype=torch.int32),
        torch.tensor([length for length, _ in seqs], dtype=torch.int32),
        scale,
        sliding_window=window,
        soft_cap=soft_cap,
    )
    want = naive(query, keys, values, [span for _, span in seqs], scale, window, soft_cap)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
