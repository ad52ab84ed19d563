# Triton kernels are a DSL: `triton.jit` is untyped and kernel arguments take Triton's own annotations.
# mypy: allow-untyped-defs, allow-incomplete-defs, allow-untyped-decorators
"""Triton unified paged attention: one launch for a flat batch of decode tokens and prefill chunks.

Twin of `fairserve_kernels.reference.paged_attention_ref`; layouts are documented there. The grid is
(query tile, kv head, split). A query tile holds BLOCK_Q tokens of one sequence times the GROUP
query heads that share a kv head, flattened into BLOCK_M rows so GQA groups of any size feed one
`tl.dot`. Each program walks its slice of the sequence's paged context in TILE_N-token tiles
(physical block looked up per token, so TILE_N and the cache block size are independent) with an
fp32 online softmax. With NUM_SPLITS > 1 (flash-decoding) each split writes a partial
(max, sum, acc) and `_reduce_splits_kernel` merges them.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterator

import torch
import triton
import triton.language as tl

from fairserve_kernels.attention_args import check_attention_args
from fairserve_kernels.checks import check_same_device, is_interpreted
from fairserve_kernels.launch_heuristics import (
    DEFAULT_ARCH,
    PREFILL_CANDIDATES,
    PrefillTiles,
    device_arch,
    launch_config,
    num_sms,
)

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)


@triton.jit
def _find_seq(query_start_loc_ptr, tile_idx, num_seqs, BLOCK_Q: tl.constexpr):
    """Binary search: the sequence whose query tiles hold `tile_idx` (sequence i starts at qsl[i] // BLOCK_Q + i)."""
    lo: tl.int32 = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        first_tile = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        if first_tile <= tile_idx:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _attend_tiles(
    q,
    m_i,
    l_i,
    acc,
    tile_lo,
    tile_hi,
    table_row,
    k_base,
    v_base,
    stride_kb,
    stride_ks,
    stride_vb,
    stride_vs,
    dims,
    dim_ok,
    row_ok,
    q_pos,
    kv_end,
    scale,
    soft_cap,
    sliding_window,
    TILE_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    USE_SOFT_CAP: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    MASKED: tl.constexpr,
):
    """Online softmax over key tiles [tile_lo, tile_hi) of the paged context; MASKED: the causal mask (and
    the window, the context's end) applied, else every key of these tiles is visible to every row."""
    cols = tl.arange(0, TILE_N)
    for t in range(tile_lo, tile_hi):
        k_pos = t * TILE_N + cols
        k_ok = k_pos < kv_end
        if MASKED:
            block = tl.load(table_row + k_pos // BLOCK_SIZE, mask=k_ok, other=0).to(tl.int64)
        else:
            block = tl.load(table_row + k_pos // BLOCK_SIZE).to(tl.int64)
        in_block = (k_pos % BLOCK_SIZE).to(tl.int64)
        k_ptrs = k_base + block[None, :] * stride_kb + in_block[None, :] * stride_ks + dims[:, None]
        if MASKED:
            k = tl.load(k_ptrs, mask=dim_ok[:, None] & k_ok[None, :], other=0.0)
        else:
            k = tl.load(k_ptrs, mask=dim_ok[:, None], other=0.0)
        s = tl.dot(q, k, input_precision=DOT_PRECISION) * scale
        if USE_SOFT_CAP:
            # tanh(x) = 1 - 2 / (exp(2x) + 1), exact at both infinities
            s = soft_cap * (1.0 - 2.0 / (tl.exp(2.0 * s / soft_cap) + 1.0))
        if MASKED:
            visible = row_ok[:, None] & (k_pos[None, :] <= q_pos[:, None])
            if USE_WINDOW:
                visible = visible & (k_pos[None, :] > q_pos[:, None] - sliding_window)
            s = tl.where(visible, s * LOG2E, float("-inf"))
        else:
            s = s * LOG2E
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # Rows with nothing visible yet keep max -inf; shift by 0 so exp2 gives 0, not NaN.
        m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_shift)
        p = tl.exp2(s - m_shift[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v_ptrs = v_base + block[:, None] * stride_vb + in_block[:, None] * stride_vs + dims[None, :]
        if MASKED:
            v = tl.load(v_ptrs, mask=k_ok[:, None] & dim_ok[None, :], other=0.0)
        else:
            v = tl.load(v_ptrs, mask=dim_ok[None, :], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
    return m_i, l_i, acc


@triton.jit
def _paged_attention_kernel(
    out_ptr,
    part_acc_ptr,
    part_max_ptr,
    part_sum_ptr,
    query_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    scale,
    soft_cap,
    sliding_window,
    num_seqs,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_bt,
    NUM_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    USE_SOFT_CAP: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DIAGONAL_MASK: tl.constexpr,
):
    """Attention of one query tile x one kv head's query group over one split of its paged context."""
    tile_idx = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    seq = _find_seq(query_start_loc_ptr, tile_idx, num_seqs, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    local_tile = tile_idx - (q_start // BLOCK_Q + seq)
    first_q = local_tile * BLOCK_Q
    if first_q >= q_len:  # spare tile of the upper-bound grid
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    context_before = seq_len - q_len  # positions cached before this span

    rows = tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    q_tok = first_q + rows // GROUP
    head = kv_head * GROUP + rows % GROUP
    row_ok = (rows < BLOCK_Q * GROUP) & (q_tok < q_len)
    dim_ok = dims < HEAD_DIM
    q_pos = context_before + q_tok
    token = (q_start + q_tok).to(tl.int64)
    q = tl.load(
        query_ptr + token[:, None] * stride_qt + head[:, None] * stride_qh + dims[None, :],
        mask=row_ok[:, None] & dim_ok[None, :],
        other=0.0,
    )

    # The tile's last query sees up to kv_end; the window trims the start for its first query.
    last_q = tl.minimum(first_q + BLOCK_Q, q_len) - 1
    kv_end = context_before + last_q + 1
    kv_start = 0
    if USE_WINDOW:
        kv_start = tl.maximum(context_before + first_q - sliding_window + 1, 0)
    tile_lo = kv_start // TILE_N
    tile_hi = tl.cdiv(kv_end, TILE_N)
    if NUM_SPLITS > 1:
        per_split = tl.cdiv(tile_hi - tile_lo, NUM_SPLITS)
        tile_lo = tile_lo + split * per_split
        tile_hi = tl.minimum(tile_lo + per_split, tile_hi)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    table_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    # Tiles before `full_hi` end at or before the tile's first query: every row sees every key there, so
    # with DIAGONAL_MASK (the prefill candidates' choice, launch_heuristics.PrefillTiles) they skip the mask,
    # as the fused-attention tutorial masks only the diagonal blocks. A window trims each row differently:
    # with one, every tile is masked. Two passes, unrolled: the full tiles unmasked (compiled only with
    # DIAGONAL_MASK and no window), then the rest masked.
    full_hi = tile_lo
    if DIAGONAL_MASK and not USE_WINDOW:
        full_hi = tl.minimum(tl.maximum((context_before + first_q + 1) // TILE_N, tile_lo), tile_hi)
    first_pass: tl.constexpr = 0 if DIAGONAL_MASK and not USE_WINDOW else 1
    k_base = k_cache_ptr + kv_head.to(tl.int64) * stride_kh
    v_base = v_cache_ptr + kv_head.to(tl.int64) * stride_vh
    for masked in tl.static_range(first_pass, 2):
        m_i, l_i, acc = _attend_tiles(
            q,
            m_i,
            l_i,
            acc,
            full_hi if masked else tile_lo,
            tile_hi if masked else full_hi,
            table_row,
            k_base,
            v_base,
            stride_kb,
            stride_ks,
            stride_vb,
            stride_vs,
            dims,
            dim_ok,
            row_ok,
            q_pos,
            kv_end,
            scale,
            soft_cap,
            sliding_window,
            TILE_N,
            BLOCK_SIZE,
            USE_WINDOW,
            USE_SOFT_CAP,
            DOT_PRECISION,
            masked,
        )

    out_mask = row_ok[:, None] & dim_ok[None, :]
    if NUM_SPLITS == 1:
        l_safe = tl.where(l_i == 0.0, 1.0, l_i)
        out = acc / l_safe[:, None]
        tl.store(
            out_ptr + token[:, None] * stride_ot + head[:, None] * stride_oh + dims[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=out_mask,
        )
    else:
        # Partials are [num_tokens, NUM_HEADS, NUM_SPLITS] (+ [HEAD_DIM]), contiguous.
        part = (token * NUM_HEADS + head) * NUM_SPLITS + split
        tl.store(part_max_ptr + part, m_i, mask=row_ok)
        tl.store(part_sum_ptr + part, l_i, mask=row_ok)
        tl.store(part_acc_ptr + part[:, None] * HEAD_DIM + dims[None, :], acc, mask=out_mask)


@triton.jit
def _reduce_splits_kernel(
    out_ptr,
    part_acc_ptr,
    part_max_ptr,
    part_sum_ptr,
    stride_ot,
    stride_oh,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    """Merge the split partials of one (token, head): rescale each split's sum and acc to the global max."""
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    splits = tl.arange(0, BLOCK_S)
    dims = tl.arange(0, BLOCK_D)
    split_ok = splits < NUM_SPLITS
    dim_ok = dims < HEAD_DIM
    base = (token * NUM_HEADS + head) * NUM_SPLITS
    m = tl.load(part_max_ptr + base + splits, mask=split_ok, other=float("-inf"))
    l_s = tl.load(part_sum_ptr + base + splits, mask=split_ok, other=0.0)
    acc = tl.load(
        part_acc_ptr + (base + splits[:, None]) * HEAD_DIM + dims[None, :],
        mask=split_ok[:, None] & dim_ok[None, :],
        other=0.0,
    )
    m_all = tl.max(m, 0)
    m_all = tl.where(m_all == float("-inf"), 0.0, m_all)
    weight = tl.exp2(m - m_all)
    total = tl.sum(weight * l_s, 0)
    total = tl.where(total == 0.0, 1.0, total)
    out = tl.sum(acc * weight[:, None], 0) / total
    tl.store(
        out_ptr + token * stride_ot + head * stride_oh + dims, out.to(out_ptr.dtype.element_ty), mask=dim_ok
    )


def paged_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    *,
    max_query_len: int | None = None,
    max_seq_len: int | None = None,
    num_splits: int | None = None,
    tile_n: int | None = None,
    prefill: PrefillTiles | None = None,
) -> torch.Tensor:
    """Causal attention of each sequence's query span over its whole paged context (see `paged_attention_ref`).

    `max_query_len`/`max_seq_len` (host ints, e.g. from AttentionMetadata) pick the tiles and the
    split-K factor without a device sync; `num_splits`/`tile_n`/`prefill` (one of the architecture's
    prefill candidates) override the heuristic.
    """
    check_attention_args(query, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale)
    device = check_same_device(
        {
            "query": query,
            "k_cache": k_cache,
            "v_cache": v_cache,
            "block_tables": block_tables,
            "query_start_loc": query_start_loc,
            "seq_lens": seq_lens,
        },
        is_interpreted(_paged_attention_kernel),
    )
    num_tokens, num_heads, head_dim = query.shape
    out = torch.empty_like(query)
    num_seqs = seq_lens.shape[0]
    if num_tokens == 0 or num_seqs == 0:
        return out
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    use_window = sliding_window is not None and sliding_window > 0
    use_soft_cap = soft_cap is not None and soft_cap > 0
    if num_splits is None and max_seq_len is None and device.type == "cuda":
        max_seq_len = int(seq_lens.max().item())  # one sync; the engine passes it instead
    cfg = launch_config(
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        num_kv_heads=num_kv_heads,
        group=group,
        head_dim=head_dim,
        max_query_len=max_query_len,
        max_seq_len=max_seq_len,
        sm_count=num_sms(device),
        num_splits=num_splits,
        tile_n=tile_n,
        arch=device_arch(device),
        elem_bytes=query.element_size(),
        prefill=prefill,
    )
    block_d = max(triton.next_power_of_2(head_dim), 16)
    if cfg.num_splits > 1:
        part_acc = torch.empty(
            (num_tokens, num_heads, cfg.num_splits, head_dim), dtype=torch.float32, device=device
        )
        part_max = torch.empty((num_tokens, num_heads, cfg.num_splits), dtype=torch.float32, device=device)
        part_sum = torch.empty_like(part_max)
    else:
        part_acc = part_max = part_sum = out  # unused by the kernel when NUM_SPLITS == 1
    grid = (num_tokens // cfg.block_q + num_seqs, num_kv_heads, cfg.num_splits)
    _paged_attention_kernel[grid](
        out,
        part_acc,
        part_max,
        part_sum,
        query,
        k_cache,
        v_cache,
        block_tables,
        query_start_loc,
        seq_lens,
        float(scale),
        float(soft_cap) if use_soft_cap and soft_cap is not None else 1.0,
        int(sliding_window) if use_window and sliding_window is not None else 0,
        num_seqs,
        query.stride(0),
        query.stride(1),
        out.stride(0),
        out.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        block_tables.stride(0),
        NUM_HEADS=num_heads,
        GROUP=group,
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        BLOCK_SIZE=k_cache.shape[1],
        TILE_N=cfg.tile_n,
        BLOCK_M=cfg.block_m,
        BLOCK_Q=cfg.block_q,
        NUM_SPLITS=cfg.num_splits,
        USE_WINDOW=use_window,
        USE_SOFT_CAP=use_soft_cap,
        DOT_PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
        DIAGONAL_MASK=cfg.diagonal_mask,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    if cfg.num_splits > 1:
        _reduce_splits_kernel[(num_tokens, num_heads)](
            out,
            part_acc,
            part_max,
            part_sum,
            out.stride(0),
            out.stride(1),
            NUM_HEADS=num_heads,
            HEAD_DIM=head_dim,
            BLOCK_D=block_d,
            NUM_SPLITS=cfg.num_splits,
            BLOCK_S=triton.next_power_of_2(cfg.num_splits),
        )
    return out


# What the engine can hand the launcher (the compile gate, fairserve_kernels/compile_gate.py, binds each).
_GATE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_GATE_HEAD_DIMS = (64, 80, 96, 128, 160, 192, 256)  # powers of two and the padded ones (BLOCK_D > HEAD_DIM)
_GATE_GROUPS = (1, 2, 4, 8)  # query heads per kv head (GQA)
_GATE_BLOCK_SIZES = (1, 16, 32, 64)  # EngineConfig.block_size: any power of two; 16 by default
# Decode shapes: (sequences, longest context). Every batch size at the longest context reaches the
# splits the batch size allows; batch 1 at shorter contexts the splits the length allows.
_GATE_DECODES = tuple((seqs, 32768) for seqs in (1, 2, 4, 8, 16, 32, 64, 128, 256)) + tuple(
    (1, context) for context in (1, 256, 512, 1024, 2048, 4096, 8192)
)
_GATE_PREFILL_TOKENS = 512  # a prefill chunk: decode_only is False, whatever its length


def compile_gate_cases() -> Iterator[Callable[[], object]]:
    """Launches on "meta" tensors over every shape class the engine produces; see compile_gate.py.

    Decode batches of every size and contexts of every length let the heuristic pick each split count
    it can; prefill chunks take the prefill tiles. Every dtype, head dim, GQA group, cache block size,
    sliding window and soft cap is crossed with them.
    """
    for dtype, head_dim, group, block_size in itertools.product(
        _GATE_DTYPES, _GATE_HEAD_DIMS, _GATE_GROUPS, _GATE_BLOCK_SIZES
    ):
        for window, cap in itertools.product((None, 128), (None, 50.0)):
            for seqs, context in _GATE_DECODES:
                yield functools.partial(
                    _gate_launch, dtype, head_dim, group, block_size, window, cap, seqs, seqs, context
                )
            yield functools.partial(
                _gate_launch, dtype, head_dim, group, block_size, window, cap, _GATE_PREFILL_TOKENS, 2, 4096
            )


def compile_gate_required() -> Iterator[Callable[[], object]]:
    """Every prefill candidate of the bound architecture (launch_heuristics.PREFILL_CANDIDATES), compiled
    whether or not the pairwise cover would pick it: a bf16 prefill chunk at head_dim 128 and 256."""
    arch = device_arch(torch.device("meta"))  # the gate's bound architecture (`assume_gpu`)
    for tiles in PREFILL_CANDIDATES.get(arch, PREFILL_CANDIDATES[DEFAULT_ARCH]):
        for head_dim in (128, 256):
            yield functools.partial(
                _gate_launch,
                torch.bfloat16,
                head_dim,
                1,
                16,
                None,
                None,
                _GATE_PREFILL_TOKENS,
                2,
                4096,
                tiles,
            )


def _gate_launch(
    dtype: torch.dtype,
    head_dim: int,
    group: int,
    block_size: int,
    window: int | None,
    cap: float | None,
    num_tokens: int,
    num_seqs: int,
    max_seq_len: int,
    prefill: PrefillTiles | None = None,
) -> torch.Tensor:
    kv_heads = 2
    meta = torch.device("meta")
    query = torch.empty(num_tokens, kv_heads * group, head_dim, dtype=dtype, device=meta)
    cache = torch.empty(64, block_size, kv_heads, head_dim, dtype=dtype, device=meta)
    block_tables = torch.empty(num_seqs, 8, dtype=torch.int32, device=meta)
    query_start_loc = torch.empty(num_seqs + 1, dtype=torch.int32, device=meta)
    seq_lens = torch.empty(num_seqs, dtype=torch.int32, device=meta)
    return paged_attention(
        query,
        cache,
        cache,
        block_tables,
        query_start_loc,
        seq_lens,
        head_dim**-0.5,
        window,
        cap,
        max_query_len=-(-num_tokens // num_seqs),
        max_seq_len=max_seq_len,
        prefill=prefill,
    )
