"""End to end: the engine on the Triton backend (interpreted on CPU) generates the reference backend's greedy tokens."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import engine
import engine.kernels
import fairserve_kernels.triton_attention as triton_attention

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
