"""ModelRunner: flattening a mixed batch, and one mixed forward pass equal to per-sequence passes."""

from __future__ import annotations

import pytest
import torch

from engine.core.request import Request, RequestMeta
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import ScheduledChunk, SchedulerOutput
from engine.worker.input_batch import BlockTableRows
from engine.worker.loader import LoadedModel, load_model
from engine.worker.model_runner import ModelRunner

BLOCK_SIZE = 4
NUM_BLOCKS = 32


@pytest.fixture(scope="module")
def tiny() -> LoadedModel:
    """The embedded default model (built once into the user cache)."""
    return load_model(None, dtype="auto", device="cpu")


def _runner(loaded: LoadedModel) -> ModelRunner:
    c = loaded.config
    return ModelRunner(
        loaded.model,
        c.num_layers,
        c.num_kv_heads,
        c.head_dim,
        NUM_BLOCKS,
        BLOCK_SIZE,
        loaded.dtype,
        torch.device("cpu"),
        "torch",
        seed=0,
    )


def _request(rid: str, prompt: list[int], output: list[int] | None = None) -> Request:
    return Request(
        rid, prompt, SamplingParams(temperature=0.0), RequestMeta(), output_token_ids=list(output or [])
    )


def _expected_layout(chunks: list[ScheduledChunk], tables: dict[str, list[int]]) -> dict[str, list[int]]:
    """Token-by-token construction of the flat layout, written independently of prepare()."""
    ids, positions, slots, starts, seq_lens, sample_rows = [], [], [], [0], [], []
    for chunk in chunks:
        tokens = chunk.request.prompt_token_ids + chunk.request.output_token_ids
        table = tables[chunk.request.request_id]
        for pos in range(chunk.start, chunk.start + chunk.length):
            ids.append(tokens[pos])
            positions.append(pos)
            block, offset = divmod(pos, BLOCK_SIZE)
            slots.append(table[block] * BLOCK_SIZE + offset)
        starts.append(starts[-1] + chunk.length)
        seq_lens.append(chunk.start + chunk.length)
        if chunk.start + chunk.length == len(tokens):
            sample_rows.append(starts[-1] - 1)
    return {
        "ids": ids,
        "positions": positions,
        "slots": slots,
        "starts": starts,
        "seq_lens": seq_lens,
        "sample_rows": sample_rows,
    }


def test_prepare_flattens_a_mixed_batch_with_scattered_blocks(tiny: LoadedModel) -> None:
    decode = _request("decode", list(range(10, 19)), output=[40, 41])  # 11 tokens, the 11th is new
    chunk_mid = _request("chunk", list(range(50, 63)))  # tokens 5..10 of 13: a middle prefill chunk
    fresh = _request("fresh", [7, 8, 9])  # whole prompt in one chunk: samples
    crossing = _request("crossing", list(range(100, 106)), output=[3, 4])  # recompute across prompt/output
    chunks = [
        ScheduledChunk(decode, 10, 1),
        ScheduledChunk(chunk_mid, 5, 6),
        ScheduledChunk(fresh, 0, 3),
        ScheduledChunk(crossing, 2, 6),
    ]
    tables = {"decode": [9, 2, 14], "chunk": [5, 11, 0, 7], "fresh": [13], "crossing": [1, 15]}
    ids, positions, meta, sample_rows = _runner(tiny).prepare(
        SchedulerOutput(iteration=1, chunks=chunks), tables
    )
    want = _expected_layout(chunks, tables)
    assert ids.tolist() == want["ids"]
    assert positions.tolist() == want["positions"]
    assert meta.slot_mapping.tolist() == want["slots"]
    assert meta.query_start_loc.tolist() == want["starts"]
    assert meta.seq_lens.tolist() == want["seq_lens"]
    assert sample_rows == want["sample_rows"]
    # Spot checks written out by hand: the decode token sits in block 14 (third logical block), offset 2;
    # the middle chunk's first token (position 5) in block 11, offset 1.
    assert meta.slot_mapping[0].item() == 14 * BLOCK_SIZE + 2
    assert meta.slot_mapping[1].item() == 11 * BLOCK_SIZE + 1
    assert sample_rows == [0, 9, 15]  # the middle chunk does not reach its end: no sample
    for row, rid in enumerate(["decode", "chunk", "fresh", "crossing"]):
        table = tables[rid]
        assert meta.block_tables[row, : len(table)].tolist() == table
    assert meta.max_query_len == 6 and meta.max_seq_len == 11


def test_prepare_of_an_empty_batch_is_empty(tiny: LoadedModel) -> None:
    ids, positions, meta, sample_rows = _runner(tiny).prepare(SchedulerOutput(iteration=1), {})
    assert ids.numel() == positions.numel() == meta.slot_mapping.numel() == 0
    assert meta.query_start_loc.tolist() == [0] and sample_rows == []


@torch.inference_mode()
def _hidden(runner: ModelRunner, chunks: list[ScheduledChunk], tables: dict[str, list[int]]) -> torch.Tensor:
    ids, positions, meta, _ = runner.prepare(SchedulerOutput(iteration=1, chunks=chunks), tables)
    hidden: torch.Tensor = runner.model(ids, positions, runner.kv_caches, meta)
    return hidden


def test_mixed_pass_matches_each_sequence_computed_alone(tiny: LoadedModel) -> None:
    gen = torch.Generator().manual_seed(3)
    prompts = {
        rid: torch.randint(0, 256, (n,), generator=gen).tolist()
        for rid, n in (("a", 13), ("b", 6), ("c", 30), ("d", 9), ("e", 20))
    }
    tables = {
        "a": [6, 1, 12, 3],
        "b": [0, 9],
        "c": [15, 4, 10, 2, 8, 5, 13, 11],
        "d": [14, 7, 18],
        "e": [30, 19, 25, 21, 27, 23],
    }
    mixed = _runner(tiny)
    # Iteration 1: a, c, d and e prefill (c and d only partly). Iteration 2: a and e decode (contexts of
    # different lengths sharing a decode bucket), b prefills whole, c and d finish their prompts.
    a, b, c, d, e = (_request(rid, prompts[rid]) for rid in "abcde")
    _hidden(
        mixed,
        [
            ScheduledChunk(a, 0, 13),
            ScheduledChunk(c, 0, 17),
            ScheduledChunk(d, 0, 4),
            ScheduledChunk(e, 0, 20),
        ],
        tables,
    )
    a.output_token_ids.append(65)
    e.output_token_ids.append(66)
    last = [
        ScheduledChunk(a, 13, 1),
        ScheduledChunk(b, 0, 6),
        ScheduledChunk(e, 20, 1),
        ScheduledChunk(c, 17, 13),
        ScheduledChunk(d, 4, 5),
    ]
    got = _hidden(mixed, last, tables)
    ends = torch.cumsum(torch.tensor([ch.length for ch in last]), 0) - 1
    for row, chunk in zip(ends.tolist(), last, strict=True):
        alone = _runner(tiny)
        whole = _request("x", chunk.request.prompt_token_ids, chunk.request.output_token_ids)
        ref = _hidden(alone, [ScheduledChunk(whole, 0, whole.num_tokens)], {"x": [2, 0, 3, 1, 5, 4, 7, 6]})
        torch.testing.assert_close(got[row], ref[-1], atol=1e-5, rtol=1e-5)


def test_one_token_each_layout_follows_growing_replaced_and_forgotten_block_tables(tiny: LoadedModel) -> None:
    """The decode fast path over the persistent block-table rows, checked against the token-by-token layout
    while tables grow in place, are replaced (a preemption's new allocation) and rows are reused."""
    runner = _runner(tiny)
    decode = _request("decode", list(range(10, 19)), output=[40, 41])  # samples at position 10
    recompute = _request(
        "recompute", list(range(60, 70)), output=[5, 6]
    )  # position 3: a lone recompute token
    prompt_end = _request("prompt-end", [7, 8, 9])  # its last prompt token: samples
    tables = {"decode": [9, 2, 14], "recompute": [4], "prompt-end": [13]}
    for step in range(3):
        chunks = [
            ScheduledChunk(decode, 10 + step, 1),
            ScheduledChunk(recompute, 3, 1),
            ScheduledChunk(prompt_end, 2, 1),
        ]
        if step == 1:
            tables["recompute"] = [8, 3]  # a new list: freed and allocated again
        if step == 2:
            tables["decode"].append(11)  # position 12 opens a fourth block: the list grows in place
        ids, positions, meta, sample_rows = runner.prepare(
            SchedulerOutput(iteration=step, chunks=chunks), tables
        )
        want = _expected_layout(chunks, tables)
        assert (ids.tolist(), positions.tolist(), meta.slot_mapping.tolist()) == (
            want["ids"],
            want["positions"],
            want["slots"],
        )
        assert meta.query_start_loc.tolist() == want["starts"] and meta.seq_lens.tolist() == want["seq_lens"]
        assert sample_rows == want["sample_rows"] == [0, 2]
        for row, rid in enumerate(["decode", "recompute", "prompt-end"]):
            assert meta.block_tables[row, : len(tables[rid])].tolist() == tables[rid]
        decode.output_token_ids.append(50 + step)
    runner.forget("decode")
    other = _request("other", [1, 2, 3, 4])
    ids, _, meta, _ = runner.prepare(
        SchedulerOutput(iteration=9, chunks=[ScheduledChunk(other, 3, 1)]), {"other": [6]}
    )
    assert meta.block_tables.tolist() == [[6]] and meta.slot_mapping.tolist() == [6 * BLOCK_SIZE + 3]


def test_block_table_rows_grow_past_their_planned_size() -> None:
    rows = BlockTableRows(rows=2, cols=2)
    lists = {f"r{i}": list(range(i, i + 1 + i % 40)) for i in range(100)}  # up to 40 blocks each
    slots = rows.rows(list(lists), list(lists.values()))
    table = rows.gather(slots, 40)
    assert table.shape == (100, 40)
    for row, blocks in enumerate(lists.values()):
        assert table[row, : len(blocks)].tolist() == blocks and not table[row, len(blocks) :].any()
