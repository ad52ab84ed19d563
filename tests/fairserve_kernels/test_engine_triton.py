"""End to end: the engine on the Triton backend (interpreted on CPU) generates the reference backend's greedy tokens."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import engine
import engine.decode_graphs as decode_graphs
import engine.kernels
import fairserve_kernels.triton_attention as triton_attention
from engine.decode_graphs import graph_batch_sizes
from fairserve_kernels.launch_heuristics import DEFAULT_SM_COUNT, choose_num_splits

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
    engine.kernels.clear_cache()  # the backend's table is rebuilt from the patched module
    expected = _generate("torch", device)
    assert not shapes, "the torch backend must not call the Triton kernel"
    got = _generate("triton", device)
    engine.kernels.clear_cache()
    assert shapes, "the Triton backend never launched the Triton kernel"
    assert any(1 < seqs < tokens for tokens, seqs in shapes), (
        "no iteration batched several sequences with a prefill chunk"
    )
    assert all(len(tokens) == 6 for tokens in expected)
    assert got == expected


def test_decode_graphs_on_triton_give_the_eager_tokens(
    device: torch.device, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A graph's attention launch is sized for max_model_len (a fixed split count), over padded rows; the
    eager launch for the batch's own longest context: the same tokens (engine/decode_graphs.py)."""
    graph_launches: list[tuple[int, int]] = []
    kernel = triton_attention.paged_attention

    def recording(query: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if kwargs.get("max_seq_len") == 2048:  # the default model's max_model_len: a graph's bound
            graph_launches.append((query.shape[0], args[4].shape[0]))
        return kernel(query, *args, **kwargs)

    monkeypatch.setattr(triton_attention, "paged_attention", recording)
    # The CUDA buckets (a CPU engine runs every size unpadded): three decodes pad to the bucket of four.
    monkeypatch.setattr(decode_graphs, "batch_sizes", lambda seats, device: graph_batch_sizes(seats))
    # Four rows of four KV heads over 2048 positions split eight ways; the contexts here span < 64.
    assert choose_num_splits(4 * 4, 2048, DEFAULT_SM_COUNT) == 8
    params = engine.SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    config: dict[str, Any] = dict(
        attention_backend="triton", device=device.type, dtype="float32", max_num_seqs=4, seed=0
    )
    eager = engine.LLM(None, enforce_eager=True, **config).generate(PROMPTS[:3], params)
    assert not graph_launches
    graphed = engine.LLM(None, **config).generate(PROMPTS[:3], params)
    assert (4, 4) in graph_launches  # three decodes in the graph of four rows, most splits empty
    assert [o.token_ids for o in graphed] == [o.token_ids for o in eager]
