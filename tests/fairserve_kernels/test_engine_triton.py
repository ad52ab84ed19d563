"""End to end: the engine on the Triton backend (interpreted on CPU) generates the reference backend's greedy tokens."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch

import engine
import engine.worker.decode_graphs as decode_graphs
import engine.worker.kernels
import fairserve_kernels.triton_attention as triton_attention
from engine.worker.decode_graphs import graph_batch_sizes
from engine.worker.model_runner import ModelRunner
from fairserve_kernels.launch_heuristics import DEFAULT_SM_COUNT, choose_num_splits, launch_config

# Lengths straddle the 16-token cache block, and a batched-token budget of 24 forces chunked
# prefill, so iterations mix decodes with prefill chunks that attend to earlier chunks.
PROMPTS = [
    "The batch never waits.",
    "a",
    "fair share of the accelerator for every tenant, in tokens",
    "xyz" * 9,
]


def _generate(backend: str, device: torch.device) -> list[list[int]]:
    llm = engine.LLM(
        model=None,
        attention_backend=backend,
        device=device.type,
        dtype="float32",
        block_size=16,
        max_num_batched_tokens=24,
        max_num_seqs=4,
        enable_prefix_caching=False,
        seed=0,
    )
    outputs = llm.generate(PROMPTS, engine.SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
    return [list(out.token_ids) for out in outputs]


def test_triton_backend_matches_reference_greedy_tokens(
    device: torch.device, monkeypatch: pytest.MonkeyPatch
) -> None:
    shapes: list[tuple[int, int]] = []
    kernel = triton_attention.paged_attention

    def counting(query: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        shapes.append((query.shape[0], args[4].shape[0]))  # (tokens, sequences) of each launch
        return kernel(query, *args, **kwargs)

    monkeypatch.setattr(triton_attention, "paged_attention", counting)
    engine.worker.kernels.clear_cache()  # the backend's table is rebuilt from the patched module
    expected = _generate("torch", device)
    assert not shapes, "the torch backend must not call the Triton kernel"
    got = _generate("triton", device)
    engine.worker.kernels.clear_cache()
    assert shapes, "the Triton backend never launched the Triton kernel"
    assert any(1 < seqs < tokens for tokens, seqs in shapes), (
        "no iteration batched several sequences with a prefill chunk"
    )
    assert all(len(tokens) == 6 for tokens in expected)
    assert got == expected


# A max_model_len at which batch 1 of the default model's four kv heads splits four ways (1040 // 256 = 4).
MAX_MODEL_LEN = 1040
CONTEXTS = [1, 129, 1000, MAX_MODEL_LEN]


def test_decode_graphs_on_triton_split_for_the_live_context(
    device: torch.device, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each decode launch, replayed from a graph or eager, splits as its live longest context asks (a graph
    per context bucket, engine/worker/decode_graphs.py): no empty splits and no reduce at short context, up to
    four splits at max_model_len; the graph path's tokens are the eager path's at every context."""
    launches: list[tuple[int, int, int]] = []  # (rows, live longest context, split count) of decode launches
    live: list[int] = []
    kernel, choose = triton_attention.paged_attention, launch_config

    def recording(query: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        # seq_lens, read on CPU; on CUDA a read would sync inside the capture, and a replay runs no Python.
        live.append(int(args[4].max()) if args[4].device.type == "cpu" else -1)
        return kernel(query, *args, **kwargs)

    def config(**kwargs: Any) -> Any:
        cfg = choose(**kwargs)
        if kwargs["max_query_len"] == 1:
            launches.append((kwargs["num_seqs"], live[-1], cfg.num_splits))
        return cfg

    to_device = ModelRunner._to_device

    def twins_for_prefills(runner: ModelRunner, batch: Any) -> Any:
        # Prompts of a thousand tokens take the interpreter minutes: prefills run the torch twins (whose
        # KV layout is the same), every decode step the Triton kernels.
        ids, positions, meta = to_device(runner, batch)
        return ids, positions, replace(meta, backend="torch") if batch.max_query_len > 1 else meta

    monkeypatch.setattr(ModelRunner, "_to_device", twins_for_prefills)
    monkeypatch.setattr(triton_attention, "paged_attention", recording)
    monkeypatch.setattr(triton_attention, "launch_config", config)
    monkeypatch.setattr(decode_graphs, "batch_sizes", lambda seats, device: graph_batch_sizes(seats))
    engine.worker.kernels.clear_cache()
    settings: dict[str, Any] = dict(
        attention_backend="triton",
        device=device.type,
        dtype="float32",
        max_num_seqs=2,
        max_model_len=MAX_MODEL_LEN,
        max_num_batched_tokens=MAX_MODEL_LEN,
        enable_prefix_caching=False,
        seed=0,
    )
    graphed, eager = engine.LLM(None, **settings), engine.LLM(None, enforce_eager=True, **settings)
    graphs = graphed.engine.runner.graphs
    assert graphs is not None and graphs.contexts[1] == [511, 1023, MAX_MODEL_LEN]
    params = engine.SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    for context in CONTEXTS:
        prompt = [[(7 * i + context) % 250 for i in range(max(context - 3, 1))]]
        launches.clear()
        before = graphs.replayed_steps
        got = graphed.generate(prompt, params)[0].token_ids
        assert graphs.replayed_steps >= before + 2, "both decode steps replay a graph"
        assert got == eager.generate(prompt, params)[0].token_ids, f"context {context}"
        if device.type != "cpu":
            continue  # the launches below are the replays' own only where a replay runs the forward (CPU)
        assert launches and all(
            splits == choose_num_splits(rows * 4, context_now, DEFAULT_SM_COUNT)
            for rows, context_now, splits in launches
        ), launches
        if context <= 511:
            assert {splits for *_, splits in launches} == {1}, "a short context runs one split, no reduce"
    if device.type == "cpu":
        assert max(splits for *_, splits in launches) == 4  # max_model_len's own bucket
    engine.worker.kernels.clear_cache()
