"""Triton unified paged attention against its torch twin, over GQA, head dims, block sizes, dtypes and batch mixes."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch

from fairserve_kernels.checks import KernelInputError
from fairserve_kernels.launch_heuristics import PREFILL_CANDIDATES, PrefillTiles
from fairserve_kernels.reference import paged_attention_ref
from fairserve_kernels.triton_attention import paged_attention
from tests.fairserve_kernels.batches import PagedBatch, make_batch

TOLERANCE = {torch.float32: 2e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}

# Decodes, a chunk after cached context, a fresh prefill, a decode at a block boundary, an empty span.
MIXED = [(1, 37), (9, 40), (1, 5), (12, 12), (1, 32), (0, 7)]
# A chunk longer than one query tile (tiles of 64 // group tokens), so a sequence spans several programs.
LONG_CHUNK = [(70, 90), (1, 21)]
DECODES = [(1, 60), (1, 1), (1, 17), (1, 128)]


def _run(
    batch: PagedBatch,
    dtype: torch.dtype,
    *,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    **kwargs: Any,
) -> None:
    scale = batch.query.shape[-1] ** -0.5
    args = (
        batch.query,
        batch.k_cache,
        batch.v_cache,
        batch.block_tables,
        batch.query_start_loc,
        batch.seq_lens,
        scale,
    )
    expected = paged_attention_ref(*args, sliding_window=sliding_window, soft_cap=soft_cap)
    got = paged_attention(*args, sliding_window=sliding_window, soft_cap=soft_cap, **kwargs)
    assert got.shape == batch.query.shape and got.dtype == dtype
    rows = batch.query_start_loc[-1].item()  # rows past the last span are padding with no defined output
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(got[:rows].float().cpu(), expected[:rows].float().cpu(), atol=tol, rtol=tol)


def _dtypes(device: torch.device) -> list[torch.dtype]:
    # The interpreter computes on numpy, which has no bf16: bf16 is checked on the GPU only.
    base = [torch.float32, torch.float16]
    return [*base, torch.bfloat16] if device.type == "cuda" else base


@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim", "block_size", "spans"),
    [
        (4, 4, 64, 16, MIXED),  # MHA
        (8, 2, 80, 32, MIXED),  # GQA 4, head_dim not a power of two
        (8, 1, 96, 64, MIXED),  # MQA
        (6, 2, 128, 16, LONG_CHUNK),  # GQA 3: group not a power of two
        (16, 2, 64, 32, DECODES),  # GQA 8, decode only
        (4, 2, 64, 8, MIXED),  # block smaller than a tile
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_matches_reference(
    device: torch.device,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    spans: list[tuple[int, int]],
    dtype: torch.dtype,
) -> None:
    batch = make_batch(
        spans,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        block_size=block_size,
        dtype=dtype,
        device=device,
    )
    _run(batch, dtype)


@pytest.mark.parametrize("num_splits", [2, 4, 8])
@pytest.mark.parametrize("spans", [DECODES, MIXED], ids=["decode", "mixed"])
def test_split_k_matches_reference(
    device: torch.device, num_splits: int, spans: list[tuple[int, int]]
) -> None:
    batch = make_batch(
        spans,
        num_heads=8,
        num_kv_heads=2,
        head_dim=64,
        block_size=16,
        dtype=torch.float16,
        device=device,
        seed=1,
    )
    _run(batch, torch.float16, num_splits=num_splits)


@pytest.mark.parametrize(("window", "num_splits"), [(1, None), (8, None), (20, 4), (500, None)])
def test_sliding_window(device: torch.device, window: int, num_splits: int | None) -> None:
    batch = make_batch(
        MIXED + LONG_CHUNK,
        num_heads=8,
        num_kv_heads=4,
        head_dim=64,
        block_size=16,
        dtype=torch.float32,
        device=device,
        seed=2,
    )
    _run(batch, torch.float32, sliding_window=window, num_splits=num_splits)


@pytest.mark.parametrize("num_splits", [None, 2])
def test_soft_cap(device: torch.device, num_splits: int | None) -> None:
    batch = make_batch(
        MIXED,
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
        block_size=32,
        dtype=torch.float16,
        device=device,
        seed=3,
    )
    batch.query.mul_(4)  # push raw scores well past the cap so the cap matters
    _run(batch, torch.float16, soft_cap=5.0, num_splits=num_splits)


def test_soft_cap_changes_the_result(device: torch.device) -> None:
    batch = make_batch(
        [(3, 20)], num_heads=4, num_kv_heads=2, head_dim=64, block_size=16, dtype=torch.float32, device=device
    )
    batch.query.mul_(4)
    args = (
        batch.query,
        batch.k_cache,
        batch.v_cache,
        batch.block_tables,
        batch.query_start_loc,
        batch.seq_lens,
        0.125,
    )
    assert not torch.allclose(paged_attention(*args, soft_cap=2.0), paged_attention(*args), atol=1e-2)


@pytest.mark.parametrize("tile_n", [16, 32, 128])
def test_tile_size_independent_of_block_size(device: torch.device, tile_n: int) -> None:
    batch = make_batch(
        MIXED,
        num_heads=4,
        num_kv_heads=1,
        head_dim=64,
        block_size=32,
        dtype=torch.float32,
        device=device,
        seed=4,
    )
    _run(batch, torch.float32, tile_n=tile_n)


@pytest.mark.parametrize("spans", [DECODES, MIXED], ids=["decode", "mixed"])
def test_host_lengths_pick_the_same_answer(device: torch.device, spans: list[tuple[int, int]]) -> None:
    batch = make_batch(
        spans,
        num_heads=8,
        num_kv_heads=2,
        head_dim=64,
        block_size=16,
        dtype=torch.float16,
        device=device,
        seed=5,
    )
    _run(batch, torch.float16, max_query_len=batch.max_query_len, max_seq_len=batch.max_seq_len)


def test_strided_query_and_padding_rows(device: torch.device) -> None:
    """Queries as a view into a fused QKV projection, with trailing padding tokens beyond the last span."""
    batch = make_batch(
        MIXED,
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
        block_size=16,
        dtype=torch.float32,
        device=device,
        seed=6,
    )
    rows, heads, dim = batch.query.shape
    fused = torch.zeros(rows + 3, (heads + 4) * dim, device=device)
    fused[:rows, : heads * dim] = batch.query.reshape(rows, -1)
    batch.query = fused[:, : heads * dim].view(rows + 3, heads, dim)
    assert not batch.query.is_contiguous()
    _run(batch, torch.float32)


def test_bf16_on_gpu(device: torch.device) -> None:
    if torch.bfloat16 not in _dtypes(device):
        pytest.skip("the Triton interpreter has no bf16; checked on CUDA")
    for spans, splits in ((MIXED, None), (LONG_CHUNK, None), (DECODES, 4)):
        batch = make_batch(
            spans,
            num_heads=32,
            num_kv_heads=8,
            head_dim=128,
            block_size=16,
            dtype=torch.bfloat16,
            device=device,
        )
        _run(batch, torch.bfloat16, num_splits=splits)


def test_gpu_head_dims_block_sizes_dtypes(device: torch.device) -> None:
    """Every head dim the engine uses, per dtype, cycling block sizes and GQA ratios (compiled kernels on CUDA)."""
    if device.type != "cuda":
        pytest.skip(
            "the interpreter covers these shapes in the tests above; this grid is for compiled kernels"
        )
    combos = ((16, 8), (32, 2), (64, 1))  # (block_size, num_kv_heads): GQA 1, 4 and MQA
    for i, dtype in enumerate(_dtypes(device)):
        block_size, num_kv_heads = combos[i % len(combos)]
        for head_dim in (64, 80, 96, 128):
            batch = make_batch(
                MIXED + LONG_CHUNK,
                num_heads=8,
                num_kv_heads=num_kv_heads,
                head_dim=head_dim,
                block_size=block_size,
                dtype=dtype,
                device=device,
            )
            _run(batch, dtype)


def _args(device: torch.device) -> dict[str, object]:
    batch = make_batch(
        [(2, 5)], num_heads=4, num_kv_heads=2, head_dim=64, block_size=16, dtype=torch.float32, device=device
    )
    return {
        "query": batch.query,
        "k_cache": batch.k_cache,
        "v_cache": batch.v_cache,
        "block_tables": batch.block_tables,
        "query_start_loc": batch.query_start_loc,
        "seq_lens": batch.seq_lens,
        "scale": 0.125,
    }


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda a: a.update(query=a["query"][0]), "query must have 3 dimensions"),
        (lambda a: a.update(query=a["query"].half()), "share a dtype"),
        (lambda a: a.update(query=a["query"].int()), "query must be one of"),
        (lambda a: a.update(query=a["query"][:, :3]), "multiple of num_kv_heads"),
        (lambda a: a.update(query=a["query"][..., :32]), "head_dim"),
        (
            lambda a: a.update(query=a["query"].transpose(1, 2).contiguous().transpose(1, 2)),
            "contiguous in its last",
        ),
        (lambda a: a.update(v_cache=a["v_cache"][:, :8]), "must match"),
        (lambda a: a.update(seq_lens=a["seq_lens"].float()), "seq_lens must be one of"),
        (lambda a: a.update(query_start_loc=a["query_start_loc"][:1]), "num_seqs + 1"),
        (lambda a: a.update(block_tables=a["block_tables"][:0]), "block_tables has 0 rows"),
        (lambda a: a.update(scale=0.0), "scale must be > 0"),
    ],
)
def test_bad_input_is_refused_before_launch(device: torch.device, change, message: str) -> None:  # type: ignore[no-untyped-def]
    args = _args(device)
    change(args)
    with pytest.raises(KernelInputError, match=re.escape(message)):
        paged_attention(**args)  # type: ignore[arg-type]


def test_bad_tuning_args_are_refused(device: torch.device) -> None:
    with pytest.raises(KernelInputError, match="tile_n"):
        paged_attention(**_args(device), tile_n=24)  # type: ignore[arg-type]
    with pytest.raises(KernelInputError, match="num_splits"):
        paged_attention(**_args(device), num_splits=0)  # type: ignore[arg-type]


@pytest.mark.parametrize("num_splits", [None, 8])
def test_padding_rows_of_a_graph_bucket(device: torch.device, num_splits: int | None) -> None:
    """Rows with a one-token span and seq_len 0 (engine/worker/decode_graphs.py pads a batch to its bucket with
    them) attend to nothing and give 0, whatever the context bound chose for splits; the others as alone."""
    spans = [(1, 60), (1, 0), (1, 17), (1, 0)]
    batch = make_batch(
        spans, num_heads=8, num_kv_heads=2, head_dim=64, block_size=16, dtype=torch.float32, device=device
    )
    _run(batch, torch.float32, num_splits=num_splits, max_query_len=1, max_seq_len=4096)
    args = (
        batch.query,
        batch.k_cache,
        batch.v_cache,
        batch.block_tables,
        batch.query_start_loc,
        batch.seq_lens,
        0.125,
    )
    for out in (paged_attention_ref(*args), paged_attention(*args, num_splits=num_splits, max_seq_len=4096)):
        assert bool((out[[1, 3]] == 0).all()) and bool(out[[0, 2]].abs().sum() > 0)


# Every prefill candidate of every architecture (fairserve_kernels/launch_heuristics.py), as the gate compiles
# them: a chunk spanning several 128-row tiles after cached context (full tiles unmasked, the diagonal
# masked), a fresh prompt, and decodes beside them; GQA 2, two kv heads.
CANDIDATE_SPANS = [(150, 230), (200, 200), (1, 90), (1, 3)]


@pytest.mark.parametrize(
    "tiles",
    sorted({t for candidates in PREFILL_CANDIDATES.values() for t in candidates}, key=repr),
    ids=repr,
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_every_prefill_candidate_matches_the_twin(
    device: torch.device, tiles: PrefillTiles, dtype: torch.dtype
) -> None:
    batch = make_batch(
        CANDIDATE_SPANS,
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
        block_size=16,
        dtype=dtype,
        device=device,
        seed=7,
    )
    _run(batch, dtype, prefill=tiles, max_query_len=200, max_seq_len=230)
