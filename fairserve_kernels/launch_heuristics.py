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
DEFAULT_ARCH = 90  # and its compute capability (9.0)
# Dynamic shared memory a block may use, opted in to the maximum: sm_90 227 KiB, sm_80 163 KiB.
SHARED_BYTES: dict[int, int] = {90: 232_448, 80: 166_912}


@dataclass(frozen=True)
class PrefillTiles:
    """One prefill tile configuration: query rows and keys per tile, warps, pipeline stages."""

    block_m: int
    tile_n: int
    num_warps: int
    num_stages: int
    diagonal_mask: bool = True  # mask only the tiles on the diagonal (the full ones before it skip it)

    def shared_bytes(self, head_dim: int, elem_bytes: int) -> int:
        """An estimate of its shared memory: the query tile, and K and V tiles in every stage."""
        block_d = max(next_power_of_2(head_dim), 16)
        return (self.block_m + 2 * self.num_stages * self.tile_n) * block_d * elem_bytes


# Prefill tiles per architecture, as Triton's fused-attention tutorial tunes them (128-row tiles, 8 warps,
# 3-4 stages; the mask only on the diagonal tiles, in the kernel), tried in order: the first whose shared
# memory fits is taken (`prefill_tiles`). The last is the one fixed choice before issue 57, kept for wide
# heads in fp32. Every candidate is compiled by the gate (`compile_gate_required` in triton_attention.py) and
# checked in the interpreter against the twin (tests/fairserve_kernels/test_triton_attention.py); the GPU
# run times them (bench/gpu_check.sh).
FALLBACK_PREFILL = PrefillTiles(block_m=64, tile_n=64, num_warps=4, num_stages=2, diagonal_mask=False)
PREFILL_CANDIDATES: dict[int, tuple[PrefillTiles, ...]] = {
    90: (PrefillTiles(128, 64, 8, 3), PrefillTiles(128, 32, 8, 4), FALLBACK_PREFILL),
    80: (PrefillTiles(128, 64, 8, 3), PrefillTiles(128, 32, 8, 3), FALLBACK_PREFILL),
}


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


# Set only by `assume_gpu` (the compile gate binds launches for a GPU it does not have).
_assumed_sm_count: int | None = None
_assumed_arch: int | None = None


@contextmanager
def assume_gpu(arch: int, sm_count: int) -> Iterator[None]:
    """Within: a non-CUDA device reports compute capability `arch` and `sm_count` SMs, so launches pick
    what they would on that GPU."""
    global _assumed_sm_count, _assumed_arch
    previous = _assumed_sm_count, _assumed_arch
    _assumed_sm_count, _assumed_arch = sm_count, arch
    try:
        yield
    finally:
        _assumed_sm_count, _assumed_arch = previous


@functools.lru_cache(maxsize=8)
def _cuda_sm_count(index: int) -> int:
    return int(torch.cuda.get_device_properties(index).multi_processor_count)


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of `device`; elsewhere DEFAULT_SM_COUNT, or what `assume_sm_count` set."""
    if device.type != "cuda":
        return DEFAULT_SM_COUNT if _assumed_sm_count is None else _assumed_sm_count
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _cuda_sm_count(index)


def device_arch(device: torch.device) -> int:
    """Compute capability of `device` as major * 10 + minor; elsewhere DEFAULT_ARCH, or what `assume_gpu` set."""
    if device.type != "cuda":
        return DEFAULT_ARCH if _assumed_arch is None else _assumed_arch
    major, minor = torch.cuda.get_device_capability(device)
    return major * 10 + minor


def prefill_tiles(arch: int, head_dim: int, elem_bytes: int) -> PrefillTiles:
    """The first of `arch`'s candidates whose estimated shared memory fits its limit (sm_90's elsewhere)."""
    candidates = PREFILL_CANDIDATES.get(arch, PREFILL_CANDIDATES[DEFAULT_ARCH])
    limit = SHARED_BYTES.get(arch, SHARED_BYTES[DEFAULT_ARCH])
    for tiles in candidates:
        if tiles.shared_bytes(head_dim, elem_bytes) <= limit:
            return tiles
    return candidates[-1]


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
    diagonal_mask: bool = False


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
    arch: int = DEFAULT_ARCH,
    elem_bytes: int = 2,
    prefill: PrefillTiles | None = None,
) -> LaunchConfig:
    """Pick tile sizes from the batch shape: small row tiles for decode-only batches, `arch`'s prefill
    candidate for the rest (`prefill_tiles`; `prefill` names one instead)."""
    # Without max_query_len, one token per sequence still means (almost surely) a pure decode batch.
    decode_only = max_query_len <= 1 if max_query_len is not None else num_tokens <= num_seqs
    wide = head_dim > 128
    if decode_only:
        tiles = PrefillTiles(16, 32 if wide else 64, 4, 2, diagonal_mask=False)
    else:
        tiles = prefill or prefill_tiles(arch, head_dim, elem_bytes)
        if tiles == FALLBACK_PREFILL and wide:
            tiles = PrefillTiles(64, 32, 4, 2, diagonal_mask=False)
    # tl.dot wants every dimension >= 16; the GQA group must fit in one tile's rows.
    block_m = max(tiles.block_m, next_power_of_2(group))
    block_q = max(block_m // group, 1)
    tile_n = tiles.tile_n if tile_n is None else tile_n
    if tile_n < 16 or tile_n & (tile_n - 1):
        raise KernelInputError(f"tile_n must be a power of two >= 16, got {tile_n}")
    if num_splits is None:
        # Prefill tiles are compute-bound and plentiful; only decode batches are split by default.
        num_splits = choose_num_splits(num_seqs * num_kv_heads, max_seq_len, sm_count) if decode_only else 1
    if num_splits < 1:
        raise KernelInputError(f"num_splits must be >= 1, got {num_splits}")
    num_warps = max(tiles.num_warps, 4 if block_m <= 64 else 8)
    return LaunchConfig(
        block_m, block_q, tile_n, num_splits, num_warps, tiles.num_stages, tiles.diagonal_mask
    )
