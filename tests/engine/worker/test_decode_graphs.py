"""Decode steps through the static, padded graph inputs (engine/worker/decode_graphs.py) give the eager path's tokens.

On CPU the "graph" is the eager forward over the static buffers, so these tests run the bucketing,
padding, buffer reuse, fallback and memory accounting of the CUDA path; only the capture needs a GPU.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

import engine.worker.decode_graphs as decode_graphs
import engine.worker.model_runner as model_runner
from engine import LLM, SamplingParams
from engine.core.byte_tokenizer import write_byte_tokenizer
from engine.serving.llm import CompletionOutput
from engine.worker.decode_graphs import DecodeGraphs, Replay, graph_batch_sizes
from engine.worker.decode_inputs import DecodeInputs
from engine.worker.host_batch import HostBatch
from engine.worker.loader import load_model
from engine.worker.model_runner import kv_block_bytes
from tests.engine.test_async_scheduling import GREEDY, assert_same
from tests.engine.test_async_scheduling import run as run_async
from tests.engine.test_engine_parity import ARCHITECTURES, COMMON, workload

# Mistral slides every layer (its KV stays in the block pool); Gemma 3 mixes sliding and global layers
# (the window pool, with prefix caching off); Qwen3-MoE routes experts per row, padding rows included.
MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ARCHITECTURES["llama"],
    "mistral": ("MistralConfig", {"sliding_window": 12}),
    "gemma3": ARCHITECTURES["gemma3"],
    "qwen3_moe": ARCHITECTURES["qwen3_moe"],
}


@pytest.fixture(autouse=True)
def cuda_buckets(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA buckets on CPU too (a CPU engine runs every size, unpadded), so these tests pad."""
    monkeypatch.setattr(decode_graphs, "batch_sizes", lambda seats, device: graph_batch_sizes(seats))


@pytest.fixture(scope="module", params=list(MODELS))
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp(request.param)
    torch.manual_seed(5)
    config_cls, extra = MODELS[request.param]
    cfg = getattr(transformers, config_cls)(**COMMON, **extra)
    transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(root)
    write_byte_tokenizer(root)
    return root


def generate(
    model: Path | None, items: list[tuple[list[int], int]], **config: Any
) -> tuple[LLM, list[CompletionOutput]]:
    """A fresh engine and its greedy outputs."""
    llm = LLM(None if model is None else str(model), dtype="float32", **config)
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for _, n in items]
    return llm, llm.generate([p for p, _ in items], params)


def tokens(outs: list[CompletionOutput]) -> list[list[int]]:
    return [o.token_ids for o in outs]


def graph_and_eager(
    model: Path | None, items: list[tuple[list[int], int]], **config: Any
) -> tuple[LLM, list[CompletionOutput], list[CompletionOutput]]:
    """The graph path's engine and outputs, and the eager path's outputs, under the same config."""
    llm, graphed = generate(model, items, **config)
    eager, reference = generate(model, items, enforce_eager=True, **config)
    assert eager.engine.runner.graphs is None
    graphs = llm.engine.runner.graphs
    assert graphs is not None and graphs.replayed_steps > 0, "no decode step went through the graphs"
    return llm, graphed, reference


def test_batch_sizes_hold_every_batch_up_to_the_seat_count() -> None:
    for seats in (1, 2, 3, 5, 8, 9, 63, 64, 65, 256):
        sizes = graph_batch_sizes(seats)
        assert sizes == sorted(set(sizes)) and sizes[0] == 1 and sizes[-1] == seats
        for n in range(1, seats + 1):
            bucket = min(s for s in sizes if s >= n)
            assert bucket - n <= (7 if n > 8 else n - 1)
    assert graph_batch_sizes(64)[:5] == [1, 2, 4, 8, 16]


@pytest.mark.parametrize(("mode", "scheduling"), [("swap", "on"), ("recompute", "off")])
def test_preemption_gives_the_eager_tokens(model_dir: Path, mode: str, scheduling: str) -> None:
    items = workload(12, seed=4)
    llm, graphed, eager = graph_and_eager(
        model_dir,
        items,
        num_kv_blocks=10,
        block_size=16,
        max_num_seqs=12,
        max_num_batched_tokens=48,
        enable_prefix_caching=False,  # Gemma 3's sliding layers then use the window pool
        preemption_mode=mode,
        async_scheduling=scheduling,
    )
    assert llm.engine.stats().preemptions_total > 0, "ten blocks must not hold twelve requests"
    assert tokens(graphed) == tokens(eager)
    if "gemma3" in model_dir.name:
        assert llm.engine.runner.windows is not None


def test_prefix_cache_hits_give_the_eager_tokens(model_dir: Path) -> None:
    items = workload(10, seed=5, shared_prefix=40)
    # Sixteen tokens a step: the first prompt's prefill finishes before the others are admitted.
    _, graphed, eager = graph_and_eager(
        model_dir, items, max_num_seqs=10, max_num_batched_tokens=16, async_scheduling="on"
    )
    assert tokens(graphed) == tokens(eager)
    assert all(o.cached_tokens >= 32 for o in graphed[1:]), "the 40-token prefix fills two 16-token blocks"


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_async_scheduling_gives_the_eager_tokens_text_and_charges(mode: str) -> None:
    loaded = load_model(None, dtype="auto", device="cpu")
    # The step's budget in new tokens only (engine/core/step_cost.py), so 16 blocks fill and preempt.
    tight: dict[str, object] = {
        "num_kv_blocks": 16,
        "block_size": 8,
        "step_cost_context": 0.0,
        "step_cost_sequence": 0.0,
    }
    graphed = run_async(loaded, True, GREEDY, None, preemption_mode=mode, **tight)
    eager = run_async(loaded, True, GREEDY, None, preemption_mode=mode, enforce_eager=True, **tight)
    assert graphed.overlapped > 0 and graphed.preemptions > 0
    assert_same(eager, graphed)


def test_padding_rows_store_nothing_in_the_kv_cache() -> None:
    llm = LLM(None, num_kv_blocks=64, block_size=4, max_num_seqs=8)
    engine = llm.engine
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    for i in range(3):  # three decodes: the graph of 4 rows runs with one padding row
        engine.add_request(f"r{i}", [5 + i, 9, 13, 21 + i], params)
    engine.step()  # the prefills
    graphs = engine.runner.graphs
    assert graphs is not None and graphs.bucket(3) == 4
    before = [k.clone() for k, _ in engine.runner.kv_caches]
    replayed = graphs.replayed_steps
    engine.step()
    assert graphs.replayed_steps == replayed + 1
    for (k, _), old in zip(engine.runner.kv_caches, before, strict=True):
        changed = (k != old).flatten(2).any(-1).flatten()  # per slot
        assert int(changed.sum()) == 3, "a slot outside the three decodes' was written"


def test_a_failed_capture_falls_back_to_eager_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(device: torch.device) -> decode_graphs.Capture:
        def capture(run: Replay) -> Replay:
            raise RuntimeError("operation not permitted when stream is capturing\nsecond line")

        return capture

    items = workload(6, seed=6)
    _, eager = generate(None, items, enforce_eager=True)
    monkeypatch.setattr(decode_graphs, "capture_for", broken)
    with caplog.at_level(logging.INFO):
        llm, got = generate(None, items)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and warnings[0].name == "engine.worker.decode_graphs"
    assert "\n" not in warnings[0].getMessage() and "RuntimeError" in warnings[0].getMessage()
    assert llm.engine.runner.graphs is None
    assert tokens(got) == tokens(eager)


def test_a_grown_window_pool_drops_the_graphs_and_keeps_the_tokens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    torch.manual_seed(5)
    config_cls, extra = ARCHITECTURES["gemma3"]
    cfg = getattr(transformers, config_cls)(**COMMON, **extra)
    transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(tmp_path)
    write_byte_tokenizer(tmp_path)
    items = workload(6, seed=7)
    _, eager = generate(tmp_path, items, enable_prefix_caching=False, block_size=4, enforce_eager=True)
    # A pool sized below the bound must grow, and a grown pool has new tensors the graphs never saw.
    monkeypatch.setattr(model_runner, "pool_blocks", lambda *args: 3)
    with caplog.at_level(logging.WARNING):
        llm, got = generate(tmp_path, items, enable_prefix_caching=False, block_size=4)
    assert llm.engine.runner.windows is not None and llm.engine.runner.windows.num_blocks > 3
    assert llm.engine.runner.graphs is None
    assert [r.name for r in caplog.records if r.levelno >= logging.WARNING] == ["engine.worker.model_runner"]
    assert tokens(got) == tokens(eager)


def test_graph_memory_comes_out_of_the_kv_budget() -> None:
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    config: dict[str, Any] = {"max_num_seqs": 64, "max_model_len": 256}
    probe = LLM(None, enforce_eager=True, num_kv_blocks=4, **config).engine
    mc = probe.loaded.config
    per_block = kv_block_bytes(mc.num_layers, 16, mc.num_kv_heads, mc.head_dim, probe.loaded.dtype)
    fraction = 200 * per_block / ram  # a budget of 200 blocks, below the 64 * 16 seats could use
    eager = LLM(None, enforce_eager=True, kv_cache_memory_fraction=fraction, **config).engine
    graphed = LLM(None, kv_cache_memory_fraction=fraction, **config).engine
    graphs = graphed.runner.graphs
    assert graphs is not None and graphs.memory_bytes > per_block
    taken = eager.pool.num_blocks - graphed.pool.num_blocks
    assert abs(taken - graphs.memory_bytes / per_block) <= 1


def _row_batch(ids: list[int], sample_rows: list[int]) -> HostBatch:
    """A decode-shaped batch (one token a row) whose rows sample `sample_rows` (a forked choice repeats its
    leader's row; a row still in its prefill samples nothing)."""
    rows = len(ids)
    return HostBatch(
        ids=torch.tensor(ids),
        positions=torch.zeros(rows, dtype=torch.int64),
        slots=torch.full((rows,), -1, dtype=torch.int64),
        table=torch.zeros((rows, 1), dtype=torch.int32),
        starts=torch.arange(rows + 1, dtype=torch.int32),
        seq_lens=torch.ones(rows, dtype=torch.int32),
        max_query_len=1,
        sample_rows=sample_rows,
        sampling=[],
        placeholders=False,
    )


@pytest.mark.parametrize("sample_rows", [[1, 1], [0, 2, 2], [2, 0, 1], [1, 1, 2]])
def test_forked_rows_read_their_leaders_logits(sample_rows: list[int]) -> None:
    """As many sample rows as rows is not every row in order: a row still in its prefill samples nothing
    while a forked choice (model_runner.py, `out.forked`) repeats its leader's row."""

    def forward(ids: torch.Tensor, positions: torch.Tensor, kv: Any, meta: Any) -> torch.Tensor:
        return ids.float().unsqueeze(1).repeat(1, 3)  # a row's logits name its token

    rows = max(len(sample_rows), max(sample_rows) + 1)
    ids = [10 * (r + 1) for r in range(rows)]
    inputs = DecodeInputs(4, 1, 3, windowed=False, device=torch.device("cpu"))
    graphs = DecodeGraphs(forward, [], inputs, [1, 2, 4], max_seq_len=64, backend="torch")
    graphs.capture(decode_graphs.capture_eager)
    batch = _row_batch(ids, sample_rows)
    logits = graphs.run(batch, batch.ids)
    assert logits[:, 0].tolist() == [float(ids[r]) for r in sample_rows]
