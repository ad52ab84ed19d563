"""Launch shape of the attention kernel: tile sizes, and when to split a long context (split-K / flash-decoding).

A decode batch gives one program per (sequence, kv head). With few sequences and long contexts
that is far fewer programs than the GPU has SMs, so most of HBM bandwidth sits idle; splitting
each context into NUM_SPLITS slices multiplies the programs, at the cost of a small reduce.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from fairserve_kernels.checks import KernelInputError

# Programs per SM we aim for: enough resident programs to keep loads in flight on every SM.
TARGET_PROGRAMS_PER_SM = 4
# A split shorter than this streams too little K/V to pay for its partial write and the reduce.
MIN_TOKENS_PER_SPLIT = 256
MAX_SPLITS = 32
# What the heuristic assumes when no GPU is present (interpreter, tests); an H100/H200 has 132.
DEFAULT_SM_COUNT = 132


def choose_num_splits(num_programs: int, max_seq_len: int | None, sm_count: int) -> int:
    """Split count (a power of two) that lifts `num_programs` towards TARGET_PROGRAMS_PER_SM * `sm_count`.

    Returns 1 when the batch already fills the GPU or the context is too short to split.
    """
    if max_seq_len is None or num_programs <= 0:
        return 1
    target = TARGET_PROGRAMS_PER_SM * max(sm_count, 1)
    if num_programs >= target:
        return 1
    wanted = -(-target // num_programs)
    by_length = max_seq_len // MIN_TOKENS_PER_SPLIT
    splits = min(wanted, by_length, MAX_SPLITS)
    if splits < 2:
        return 1
    return 1 << (splits.bit_length() - 1)  # round down: one compiled variant per power of two


def split_context_bounds(num_programs: int, max_context: int, sm_count: int) -> list[tuple[int, int]]:
    """(bound, split count) pairs, ascending, the last bound `max_context`: every context above the previous
    bound and up to this one gets this split count from `choose_num_splits`. A CUDA graph fixes its launch
    at capture, so the engine captures one per pair (engine/worker/decode_graphs.py) and replays the one of the
    step's live context: a short context runs no empty splits and no reduce.

    The count changes only where `context // MIN_TOKENS_PER_SPLIT` crosses a power of two (then it is
    rounded down to one, and capped by MAX_SPLITS and by the programs the batch already has), so the
    candidates are the last context before each crossing; neighbours with the same count merge.
    """
    crossings = (MIN_TOKENS_PER_SPLIT * (1 << j) - 1 for j in range(1, MAX_SPLITS.bit_length()))
    candidates = sorted({c for c in crossings if c < max_context} | {max_context})
    bounds: list[tuple[int, int]] = []
    for bound in candidates:
        splits = choose_num_splits(num_programs, bound, sm_count)
        if bounds and bounds[-1][1] == splits:
            bounds[-1] = (bound, splits)
        else:
            bounds.append((bound, splits))
    return bounds


# Set only by `assume_sm_count` (the compile gate binds launches for a GPU it does not have).
_assumed_sm_count: int | None = None


@contextmanager
def assume_sm_count(sm_count: int) -> Iterator[None]:
    """Within: a non-CUDA device reports `sm_count` SMs, so launches pick what they would on that GPU."""
    global _assumed_sm_count
    previous, _assumed_sm_count = _assumed_sm_count, sm_count
    try:
        yield
    finally:
        _assumed_sm_count = previous


@functools.lru_cache(maxsize=8)
def _cuda_sm_count(index: int) -> int:
    return int(torch.cuda.get_device_properties(index).multi_processor_count)


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of `device`; elsewhere DEFAULT_SM_COUNT, or what `assume_sm_count` set."""
    if device.type != "cuda":
        return DEFAULT_SM_COUNT if _assumed_sm_count is None else _assumed_sm_count
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _cuda_sm_count(index)


def next_power_of_2(n: int) -> int:
    """Smallest power of two >= n (1 for n <= 1)."""
    return 1 << max(n - 1, 0).bit_length()


@dataclass(frozen=True)
class LaunchConfig:
    """Tile shape and split count of one launch (all compile-time constants of the kernel)."""

    block_m: int
    block_q: int
    tile_n: int
    num_splits: int
    num_warps: int
    num_stages: int


def launch_config(
    *,
    num_tokens: int,
    num_seqs: int,
    num_kv_heads: int,
    group: int,
    head_dim: int,
    max_query_len: int | None,
    max_seq_len: int | None,
    sm_count: int,
    num_splits: int | None = None,
    tile_n: int | None = None,
) -> LaunchConfig:
    """Pick tile sizes from the batch shape: small row tiles for decode-only batches, larger for prefill."""
    # Without max_query_len, one token per sequence still means (almost surely) a pure decode batch.
    decode_only = max_query_len <= 1 if max_query_len is not None else num_tokens <= num_seqs
    # tl.dot wants every dimension >= 16; the GQA group must fit in one tile's rows.
    block_m = max(16 if decode_only else 64, next_power_of_2(group))
    block_q = max(block_m // group, 1)
    if tile_n is None:
        tile_n = 64 if head_dim <= 128 else 32
    if tile_n < 16 or tile_n & (tile_n - 1):
        raise KernelInputError(f"tile_n must be a power of two >= 16, got {tile_n}")
    if num_splits is None:
        # Prefill tiles are compute-bound and plentiful; only decode batches are split by default.
        num_splits = choose_num_splits(num_seqs * num_kv_heads, max_seq_len, sm_count) if decode_only else 1
    if num_splits < 1:
        raise KernelInputError(f"num_splits must be >= 1, got {num_splits}")
    num_warps = 4 if block_m <= 64 else 8
    return LaunchConfig(block_m, block_q, tile_n, num_splits, num_warps, num_stages=2)
