"""Sliding-window layers free the KV blocks that fall behind the window: the pool, and the engine on Gemma 3."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from engine import LLM, SamplingParams
from engine.core.byte_tokenizer import write_byte_tokenizer
from engine.worker.host_batch import HostBatch
from engine.worker.window_cache import NULL_BLOCK, WindowBlocks, pool_blocks
from tests.engine.test_engine_parity import COMMON, Reference, workload

WINDOW = 12
BLOCK = 4


def _pool(blocks: int = 8) -> WindowBlocks:
    return WindowBlocks(WINDOW, BLOCK, 2, (1, 2), torch.float32, torch.device("cpu"), blocks)


def test_blocks_behind_the_window_go_back_to_the_free_list() -> None:
    pool = _pool()
    table = pool.claim("a", 0, 10)  # positions 0..9: three blocks
    assert NULL_BLOCK not in table and len(table) == 3 and pool.num_used == 3
    table = pool.claim("a", 30, 31)  # query at 30 sees 19..30: blocks 4..7
    assert table[:4] == [NULL_BLOCK] * 4 and NULL_BLOCK not in table[4:] and len(table) == 8
    assert pool.num_used == 4
    pool.release("a")
    assert pool.num_used == 0


def test_idle_requests_are_trimmed_and_restarts_start_afresh() -> None:
    pool = _pool()
    pool.claim("a", 0, 24)  # a 24-token prefill holds six blocks
    pool.claim("b", 0, 2)
    pool.trim_idle({"b"})  # a's next query (24) sees 13..24: blocks 3..5 stay
    assert pool.tables["a"][:3] == [NULL_BLOCK] * 3 and pool.num_used == 4
    pool.claim("a", 0, 3)  # recomputed from the start
    assert pool.tables["a"] != [] and len(pool.tables["a"]) == 1


def test_save_and_restore_keep_the_live_blocks_contents() -> None:
    pool = _pool()
    table = pool.claim("a", 20, 22)
    live = [b for b in table if b != NULL_BLOCK]
    for k, v in pool.caches:
        k[live] = 1.5
        v[live] = -2.0
    which, saved = pool.save("a")
    assert pool.num_used == 0 and which == [i for i, b in enumerate(table) if b != NULL_BLOCK]
    pool.claim("other", 0, 8)  # reuses the freed blocks
    pool.restore("a", which, saved)
    restored = [pool.tables["a"][i] for i in which]
    for k, v in pool.caches:
        assert bool((k[restored] == 1.5).all()) and bool((v[restored] == -2.0).all())


def test_the_pool_grows_when_a_batch_needs_more() -> None:
    pool = _pool(blocks=3)
    pool.claim("a", 0, 16)
    assert pool.num_blocks >= 5 and pool.num_used == 4


@pytest.fixture(scope="module")
def gemma(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    root: Path = tmp_path_factory.mktemp("gemma3-window")
    torch.manual_seed(11)
    layer_types = ["sliding_attention", "full_attention"] * 2
    cfg = transformers.Gemma3TextConfig(
        **COMMON | {"num_hidden_layers": 4}, head_dim=16, sliding_window=WINDOW, layer_types=layer_types
    )
    hf = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    hf.save_pretrained(root)
    write_byte_tokenizer(root)
    return Reference(root, hf, {})


def test_memory_stays_bounded_on_a_long_generation(gemma: Reference, monkeypatch: pytest.MonkeyPatch) -> None:
    prompts = [[(7 * i + j) % 250 for j in range(20)] for i in range(2)]
    new_tokens = 64
    llm = LLM(str(gemma.path), dtype="float32", block_size=BLOCK, enable_prefix_caching=False, max_num_seqs=4)
    runner = llm.engine.runner
    windows = runner.windows
    assert windows is not None and runner.window_layers == [0, 2]
    used: list[int] = []
    full_used: list[int] = []
    prepare = runner.prepare_host

    def prepare_and_record(*args: Any) -> HostBatch:
        batch = prepare(*args)
        used.append(windows.num_used)
        full_used.append(llm.engine.pool.num_used)
        return batch

    monkeypatch.setattr(runner, "prepare_host", prepare_and_record)
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    got = llm.generate(prompts, [params] * len(prompts))
    # A decode sees 12 positions back, which touch at most 4 blocks of 4, however long the request runs
    # (its 20-token prompt: 5); the global layers' blocks grow with the context (84 tokens: 21 blocks each).
    assert len(used) >= new_tokens and max(used[1:]) <= 2 * 4 and used[0] == 2 * 5
    assert max(full_used) == 2 * 21
    assert windows.num_blocks == pool_blocks(WINDOW, BLOCK, 4, llm.engine.config.max_num_batched_tokens)
    assert windows.num_used == 0 and not windows.tables
    assert [o.token_ids for o in got] == [gemma.greedy(p, new_tokens) for p in prompts]


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_window_pool_matches_hf_under_chunks_and_preemption(gemma: Reference, mode: str) -> None:
    items = workload(12, seed=9)
    llm = LLM(
        str(gemma.path),
        dtype="float32",
        enable_prefix_caching=False,
        num_kv_blocks=10,
        block_size=16,
        max_num_seqs=12,
        max_num_batched_tokens=24,
        preemption_mode=mode,
        # The step's budget in new tokens only (engine/core/step_cost.py): the device's step cost admits fewer
        # prompts at once, and 10 blocks must fill for preemptions to happen.
        step_cost_context=0.0,
        step_cost_sequence=0.0,
    )
    assert llm.engine.runner.windows is not None
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for _, n in items]
    got = [o.token_ids for o in llm.generate([p for p, _ in items], params)]
    assert llm.engine.stats().preemptions_total > 0
    assert got == [gemma.greedy(p, n) for p, n in items]
    assert llm.engine.runner.windows.num_used == 0
