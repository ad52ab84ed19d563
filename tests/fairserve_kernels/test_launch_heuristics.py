"""Launch heuristics: tiles that fit the GQA group, and split-K only when a long-context batch leaves most SMs idle."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairserve_kernels.checks import KernelInputError
from fairserve_kernels.launch_heuristics import (
    FALLBACK_PREFILL,
    MAX_SPLITS,
    MIN_TOKENS_PER_SPLIT,
    PREFILL_CANDIDATES,
    SHARED_BYTES,
    TARGET_PROGRAMS_PER_SM,
    choose_num_splits,
    launch_config,
    next_power_of_2,
    prefill_tiles,
    split_context_bounds,
)


def test_small_batch_long_context_is_split() -> None:
    # batch 1, 8 kv heads, 16k context on 132 SMs: 8 programs would leave 124 SMs idle
    assert choose_num_splits(8, 16384, 132) == 32


def test_full_gpu_is_not_split() -> None:
    assert choose_num_splits(256 * 8, 16384, 132) == 1


def test_short_context_is_not_split() -> None:
    assert choose_num_splits(8, MIN_TOKENS_PER_SPLIT + 1, 132) == 1


def test_unknown_length_is_not_split() -> None:
    assert choose_num_splits(8, None, 132) == 1


@given(
    programs=st.integers(1, 5000),
    max_seq_len=st.integers(1, 1 << 20),
    sm_count=st.integers(1, 200),
)
def test_splits_are_bounded_powers_of_two(programs: int, max_seq_len: int, sm_count: int) -> None:
    splits = choose_num_splits(programs, max_seq_len, sm_count)
    assert 1 <= splits <= MAX_SPLITS and splits & (splits - 1) == 0
    if splits > 1:
        # every split still streams a worthwhile slice, and splitting never overshoots the target by 2x
        assert max_seq_len // splits >= MIN_TOKENS_PER_SPLIT
        assert programs * splits < 2 * TARGET_PROGRAMS_PER_SM * sm_count


def test_launch_config_tiles_fit_gqa_group() -> None:
    decode = launch_config(
        num_tokens=64,
        num_seqs=64,
        num_kv_heads=8,
        group=4,
        head_dim=128,
        max_query_len=1,
        max_seq_len=4096,
        sm_count=132,
    )
    prefill = launch_config(
        num_tokens=600,
        num_seqs=2,
        num_kv_heads=8,
        group=4,
        head_dim=128,
        max_query_len=512,
        max_seq_len=4096,
        sm_count=132,
    )
    wide = launch_config(
        num_tokens=8,
        num_seqs=8,
        num_kv_heads=1,
        group=32,
        head_dim=64,
        max_query_len=1,
        max_seq_len=64,
        sm_count=132,
    )
    assert decode.block_m >= 16 and decode.block_q * 4 <= decode.block_m
    assert prefill.block_q > decode.block_q
    assert wide.block_m >= 32 and wide.block_q == wide.block_m // 32
    assert prefill.num_splits == 1 and decode.num_splits > 1


def test_tuning_overrides_are_checked() -> None:
    base: dict[str, Any] = {
        "num_tokens": 4,
        "num_seqs": 4,
        "num_kv_heads": 2,
        "group": 2,
        "head_dim": 64,
        "max_query_len": 1,
        "max_seq_len": 64,
        "sm_count": 132,
    }
    assert launch_config(**base, num_splits=4, tile_n=16).num_splits == 4
    with pytest.raises(KernelInputError, match="tile_n"):
        launch_config(**base, tile_n=48)
    with pytest.raises(KernelInputError, match="num_splits"):
        launch_config(**base, num_splits=0)


@pytest.mark.parametrize("arch", sorted(PREFILL_CANDIDATES))
def test_prefill_takes_the_first_candidate_that_fits_the_architecture(arch: int) -> None:
    """128-row tiles with 8 warps and 3-4 stages where their shared memory fits (bf16 up to head_dim 256 on
    sm_90), the old 64-row tiles for fp32 wide heads; decode keeps its small row tiles."""
    shape: dict[str, Any] = {
        "num_seqs": 2,
        "num_kv_heads": 8,
        "group": 1,
        "max_seq_len": 4096,
        "sm_count": 132,
    }
    for head_dim, elem_bytes in ((64, 2), (128, 2), (256, 2), (128, 4), (256, 4)):
        cfg = launch_config(
            num_tokens=600, max_query_len=512, head_dim=head_dim, arch=arch, elem_bytes=elem_bytes, **shape
        )
        tiles = prefill_tiles(arch, head_dim, elem_bytes)
        assert tiles in PREFILL_CANDIDATES[arch]
        assert tiles.shared_bytes(head_dim, elem_bytes) <= SHARED_BYTES[arch] or tiles == FALLBACK_PREFILL
        assert (cfg.block_m, cfg.num_warps, cfg.num_stages) == (
            tiles.block_m,
            tiles.num_warps,
            tiles.num_stages,
        )
    assert prefill_tiles(arch, 128, 2).block_m == 128 and prefill_tiles(arch, 128, 2).num_stages >= 3
    assert prefill_tiles(arch, 256, 4) == FALLBACK_PREFILL
    decode = launch_config(num_tokens=2, max_query_len=1, head_dim=128, arch=arch, **shape)
    assert decode.block_m == 16 and decode.num_stages == 2


@given(st.integers(1, 10_000))
def test_next_power_of_2(n: int) -> None:
    p = next_power_of_2(n)
    assert p >= n and p & (p - 1) == 0 and p // 2 < n


@given(
    programs=st.integers(1, 2048),
    max_context=st.integers(1, 40_000),
    sm_count=st.sampled_from([1, 108, 132]),
    context=st.integers(1, 40_000),
)
def test_split_bounds_give_each_context_its_own_split_count(
    programs: int, max_context: int, sm_count: int, context: int
) -> None:
    """The decode graphs' context buckets: the bucket of a context has the split count that context picks."""
    bounds = split_context_bounds(programs, max_context, sm_count)
    assert bounds[-1][0] == max_context
    assert [b for b, _ in bounds] == sorted({b for b, _ in bounds})
    assert all(a[1] != b[1] for a, b in itertools.pairwise(bounds)), "neighbours with one count merge"
    context = min(context, max_context)
    bound, splits = next(pair for pair in bounds if pair[0] >= context)
    assert (
        splits
        == choose_num_splits(programs, context, sm_count)
        == choose_num_splits(programs, bound, sm_count)
    )


def test_short_contexts_share_one_unsplit_bucket() -> None:
    # Batch 1 of 8 kv heads on 132 SMs: up to 511 tokens 1 split, then 2, 4, 8, 16, 32.
    assert split_context_bounds(8, 32768, 132) == [
        (511, 1),
        (1023, 2),
        (2047, 4),
        (4095, 8),
        (8191, 16),
        (32768, 32),
    ]
    assert split_context_bounds(64 * 8, 2048, 132) == [(511, 1), (2048, 2)]
    assert split_context_bounds(256 * 8, 32768, 132) == [(32768, 1)]  # the batch fills the GPU
