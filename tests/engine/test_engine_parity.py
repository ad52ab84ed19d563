"""Token-for-token greedy parity of the whole engine with `transformers` generate(), under every batching mode."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from engine import LLM, SamplingParams
from engine.core.byte_tokenizer import write_byte_tokenizer

COMMON: dict[str, Any] = dict(
    vocab_size=300,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    initializer_range=0.1,
    rms_norm_eps=1e-5,
)


@dataclass
class Reference:
    """A saved random-weight HF model and a memo of its greedy continuations."""

    path: Path
    hf: Any
    memo: dict[tuple[tuple[int, ...], int], list[int]]

    def greedy(self, prompt: list[int], n: int) -> list[int]:
        key = (tuple(prompt), n)
        if key not in self.memo:
            with torch.no_grad():
                out = self.hf.generate(
                    torch.tensor([prompt]),
                    attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                    max_new_tokens=n,
                    min_new_tokens=n,
                    do_sample=False,
                )
            self.memo[key] = out[0, len(prompt) :].tolist()
        return self.memo[key]


# The config class of each architecture and what its small random config adds to COMMON.
ARCHITECTURES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", {}),
    "qwen2": ("Qwen2Config", {}),
    "qwen3": ("Qwen3Config", {"head_dim": 16}),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        {"head_dim": 16, "moe_intermediate_size": 32, "num_experts": 4, "num_experts_per_tok": 2},
    ),
    # Layer 0 slides over 12 tokens, layer 1 is global: prompts and outputs run well past the window.
    "gemma3": ("Gemma3TextConfig", {"head_dim": 16, "sliding_window": 12, "sliding_window_pattern": 2}),
}


@pytest.fixture(scope="module", params=list(ARCHITECTURES))
def reference(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Reference:
    root = tmp_path_factory.mktemp(request.param)
    torch.manual_seed(7)
    config_cls, extra = ARCHITECTURES[request.param]
    cfg = getattr(transformers, config_cls)(**COMMON, **extra)
    hf = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    hf.save_pretrained(root)
    write_byte_tokenizer(root)
    return Reference(root, hf, {})


def workload(n: int, seed: int, shared_prefix: int = 0) -> list[tuple[list[int], int]]:
    """n prompts of mixed lengths (4..60 tokens) with mixed output lengths (2..24)."""
    rng = random.Random(seed)
    prefix = [rng.randrange(256) for _ in range(shared_prefix)]
    return [
        (prefix + [rng.randrange(256) for _ in range(rng.randint(4, 60))], rng.randint(2, 24))
        for _ in range(n)
    ]


@pytest.fixture(params=["off", "on"])
def scheduling(request: pytest.FixtureRequest) -> str:
    """EngineConfig.async_scheduling: every batching mode must match transformers with and without overlap."""
    return str(request.param)


def run_engine(
    ref: Reference, items: list[tuple[list[int], int]], scheduling: str, **config: Any
) -> tuple[LLM, list[list[int]]]:
    llm = LLM(str(ref.path), dtype="float32", async_scheduling=scheduling, **config)
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for _, n in items]
    outs = llm.generate([p for p, _ in items], params)
    return llm, [o.token_ids for o in outs]


def expected(ref: Reference, items: list[tuple[list[int], int]]) -> list[list[int]]:
    return [ref.greedy(p, n) for p, n in items]


def test_single_requests_match(reference: Reference) -> None:
    items = workload(3, seed=1)
    llm = LLM(str(reference.path), dtype="float32")
    for prompt, n in items:
        out = llm.generate(prompt, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))[0]
        assert out.token_ids == reference.greedy(prompt, n)


def test_concurrent_mixed_lengths_match(reference: Reference, scheduling: str) -> None:
    items = workload(18, seed=2)
    _, got = run_engine(reference, items, scheduling, max_num_batched_tokens=512, max_num_seqs=32)
    assert got == expected(reference, items)


def test_chunked_prefill_matches(reference: Reference, scheduling: str) -> None:
    items = workload(16, seed=3)
    llm, got = run_engine(reference, items, scheduling, max_num_batched_tokens=8, max_num_seqs=16)
    assert got == expected(reference, items)
    # The budget really forced chunks: prompts longer than 8 tokens took several iterations.
    assert max(t.prefill_tokens for t in llm.engine.traces) <= 8


def test_preemption_matches(reference: Reference, scheduling: str) -> None:
    items = workload(16, seed=4)
    llm, got = run_engine(
        reference,
        items,
        scheduling,
        num_kv_blocks=10,
        block_size=16,
        max_num_seqs=16,
        enable_prefix_caching=False,
    )
    assert llm.engine.stats().preemptions_total > 0, "ten blocks must not hold sixteen requests"
    assert got == expected(reference, items)
    assert llm.engine.pool.num_free == 10


def test_prefix_cache_hits_match(reference: Reference, scheduling: str) -> None:
    items = workload(16, seed=5, shared_prefix=40)
    llm = LLM(str(reference.path), dtype="float32", max_num_seqs=16, async_scheduling=scheduling)
    first = llm.generate(
        items[0][0], SamplingParams(max_tokens=items[0][1], temperature=0.0, ignore_eos=True)
    )
    outs = llm.generate(
        [p for p, _ in items[1:]],
        [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for _, n in items[1:]],
    )
    assert [o.token_ids for o in first + outs] == expected(reference, items)
    assert all(o.cached_tokens >= 32 for o in outs), "the 40-token shared prefix fills two 16-token blocks"


def test_greedy_logprobs_match_transformers_logits(reference: Reference, scheduling: str) -> None:
    """SamplingParams.logprobs under greedy decoding: each token's logprob and its five most likely
    alternatives are log_softmax of transformers' logits at that position (several requests batched)."""
    items = workload(4, seed=6)
    llm = LLM(str(reference.path), dtype="float32", async_scheduling=scheduling)
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, logprobs=5) for _, n in items]
    outs = llm.generate([p for p, _ in items], params)
    for (prompt, n), out in zip(items, outs, strict=True):
        assert out.token_ids == reference.greedy(prompt, n)
        assert out.logprobs is not None and len(out.logprobs) == n
        with torch.no_grad():
            logits = reference.hf(torch.tensor([prompt + out.token_ids])).logits[0]
        want = torch.log_softmax(logits[len(prompt) - 1 : len(prompt) - 1 + n].float(), dim=-1)
        for step, (token, got) in enumerate(zip(out.token_ids, out.logprobs, strict=True)):
            assert got.logprob == pytest.approx(float(want[step, token]), abs=1e-4)
            top = torch.topk(want[step], 5)
            assert got.top_ids == top.indices.tolist()
            assert got.top_logprobs == pytest.approx(top.values.tolist(), abs=1e-4)
