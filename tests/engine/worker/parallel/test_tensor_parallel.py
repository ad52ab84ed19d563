"""Tensor parallelism on CPU (gloo): TP=2 and TP=4 give greedy output token-identical to TP=1, the fairness
trace is the same, each rank holds its shard, and a dead rank ends the engine instead of hanging it.

Each engine with tensor_parallel_size > 1 starts real worker processes; the models are tiny random ones.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
import transformers
from safetensors.torch import save_file

from engine import LLM, EngineDeadError, ProcessEngine, SamplingParams
from engine.config import EngineConfig
from engine.core.byte_tokenizer import write_byte_tokenizer
from engine.core.request import RequestMeta
from engine.serving.llm import CompletionOutput
from engine.serving.llm_engine import LLMEngine
from engine.worker import decode_graphs
from engine.worker.decode_graphs import graph_batch_sizes
from engine.worker.layers import SourceSlice
from engine.worker.loader import iter_tensors
from engine.worker.rank_steps import TensorParallelLost
from tests.engine.test_engine_parity import ARCHITECTURES, COMMON  # heads, vocab and widths divide by 4
from tests.engine.test_engine_parity import workload as parity_workload


def write_model(root: Path, arch: str, **overrides: Any) -> Path:
    torch.manual_seed(7)
    config_cls, extra = ARCHITECTURES[arch]
    cfg = getattr(transformers, config_cls)(**(COMMON | extra | overrides))
    transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(root)
    write_byte_tokenizer(root)
    return root


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {arch: write_model(tmp_path_factory.mktemp(arch), arch) for arch in ARCHITECTURES}


def workload(n: int, seed: int, shared_prefix: int = 0) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    prefix = [rng.randrange(256) for _ in range(shared_prefix)]
    return [
        (prefix + [rng.randrange(256) for _ in range(rng.randint(4, 40))], rng.randint(2, 12))
        for _ in range(n)
    ]


def generate(
    path: Path, items: list[tuple[list[int], int]], **config: Any
) -> tuple[list[CompletionOutput], LLM]:
    """Greedy outputs, the first request alone (so the rest may hit its cached prefix), then the others."""
    llm = LLM(str(path), dtype="float32", **config)
    try:
        params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for _, n in items]
        outs = llm.generate(items[0][0], params[0])
        outs += llm.generate([p for p, _ in items[1:]], params[1:])
        return outs, llm
    finally:
        llm.engine.close()


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_tp2_matches_tp1_under_chunked_prefill_prefix_caching_and_async_scheduling(
    models: dict[str, Path], arch: str
) -> None:
    items = workload(6, seed=1, shared_prefix=20)
    config: dict[str, Any] = dict(max_num_batched_tokens=16, async_scheduling="on")
    want, _ = generate(models[arch], items, **config)
    got, llm = generate(models[arch], items, tensor_parallel_size=2, **config)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert max(t.prefill_tokens for t in llm.engine.traces) <= 16  # prompts of up to 60 tokens: chunked
    assert all(o.cached_tokens >= 16 for o in got[1:]), "the 20-token shared prefix fills a block"


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_tp2_matches_tp1_under_preemption_and_holds_half_the_sharded_weights(
    models: dict[str, Path], mode: str
) -> None:
    items = parity_workload(16, seed=4)  # what test_engine_parity's preemption case runs
    config: dict[str, Any] = dict(
        num_kv_blocks=10, block_size=16, max_num_seqs=16, enable_prefix_caching=False, preemption_mode=mode
    )
    want, whole = generate(models["llama"], items, **config)
    got, llm = generate(models["llama"], items, tensor_parallel_size=2, **config)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    if mode == "swap":  # each rank swapped its own shard out and back in
        assert llm.engine.stats().swapped_bytes_total > 0
    assert llm.engine.stats().preemptions_total > 0, "ten blocks must not hold sixteen requests"

    # Norms are replicated; every other weight (embedding, projections, LM head) is split in two.
    def sizes(engine: LLMEngine) -> tuple[int, int]:
        params = list(engine.loaded.model.named_parameters())
        norms = sum(p.numel() for n, p in params if "norm" in n)
        return norms, sum(p.numel() for _, p in params) - norms

    norms, sharded = sizes(whole.engine)
    assert sizes(llm.engine) == (norms, sharded // 2)


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_tp4_matches_tp1_with_kv_heads_replicated(models: dict[str, Path], arch: str, tmp_path: Path) -> None:
    # Two KV heads over four ranks: each KV head lives on the two ranks whose q heads read it. Llama's
    # vocabulary of 302 does not divide by 4: the last rank's shard is padded.
    path = write_model(tmp_path, arch, vocab_size=302) if arch == "llama" else models[arch]
    items = workload(3, seed=3)
    want, _ = generate(path, items, max_num_batched_tokens=16)
    got, _ = generate(path, items, max_num_batched_tokens=16, tensor_parallel_size=4)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_tp2_decode_graphs_pad_the_same_bucket_on_every_rank(
    models: dict[str, Path], arch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decode steps replay the graph path on each rank (CPU: the eager "capture" over the static buffers),
    padded to CUDA's buckets (1, 2, 4, 8: five requests run as eight rows). Rank 1 learns the buckets from
    rank 0's allocate message: a rank that ran such a step unpadded would meet rank 0's all-reduce with a
    tensor of another shape, and the step would fail. Greedy tokens equal TP=1's eager ones."""
    monkeypatch.setattr(decode_graphs, "batch_sizes", lambda seats, device: graph_batch_sizes(seats))
    items = workload(5, seed=6)
    want, _ = generate(models[arch], items, enforce_eager=True, max_num_seqs=8)
    got, llm = generate(models[arch], items, tensor_parallel_size=2, max_num_seqs=8)
    graphs = llm.engine.runner.graphs
    assert graphs is not None and graphs.sizes == [1, 2, 4, 8]
    assert graphs.replayed_steps > 0
    assert [o.token_ids for o in got] == [o.token_ids for o in want]


def test_tp2_choices_fork_and_copy_on_write_on_every_rank(models: dict[str, Path]) -> None:
    """n = 3 with a prompt that ends inside a block: the choices share its blocks and copy the partial one
    when first written, each rank its own shard; seeded choices equal TP=1's. (The copies reach the other
    ranks in the step's message, test_steps.py; on this small random model a shard left uncopied did not
    change the sampled tokens, so this is parity, not a proof of rank 1's copy.)"""
    prompt = list(range(3, 26))  # 23 tokens: blocks of 16 leave a partial last one
    params = SamplingParams(max_tokens=10, temperature=0.8, seed=5, ignore_eos=True, n=3)

    def choices(**config: Any) -> list[list[int]]:
        llm = LLM(str(models["llama"]), dtype="float32", block_size=16, **config)
        try:
            outs = llm.engine
            outs.add_request("r", prompt, params)
            got: dict[int, list[int]] = {}
            while outs.has_unfinished():
                for delta in outs.step_deltas():
                    got.setdefault(delta.index, []).extend(delta.new_token_ids)
            return [got[i] for i in sorted(got)]
        finally:
            llm.engine.close()

    want = choices()
    assert len(want) == 3 and len({tuple(t) for t in want}) == 3
    assert choices(tensor_parallel_size=2) == want


def essay_completion_steps(path: Path, world: int) -> dict[str, int]:
    """The essay's four-request trace (two slots; A and B at step 0, C at 1, D at 3; 8, 2, 3 and 1 tokens)
    on the real engine: the iteration at which each request finished."""
    engine = LLMEngine(
        EngineConfig(model=str(path), dtype="float32", max_num_seqs=2, tensor_parallel_size=world)
    )
    trace = {"A": (0, 8), "B": (0, 2), "C": (1, 3), "D": (3, 1)}
    done: dict[str, int] = {}
    try:
        for step in range(1, 20):
            for name, (arrival, tokens) in trace.items():
                if arrival == step - 1:
                    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
                    engine.add_request(name, [1, 2, 3, 4], params, RequestMeta(tenant_id=name))
            done |= {o.request_id: step for o in engine.step() if o.finished}
    finally:
        engine.close()
    return done


def test_the_essay_trace_is_exact_under_tp2(models: dict[str, Path]) -> None:
    assert essay_completion_steps(models["llama"], 2) == {"A": 8, "B": 2, "C": 5, "D": 6}


def test_killing_rank_1_mid_stream_ends_the_engine_as_one_unit(models: dict[str, Path]) -> None:
    engine = LLMEngine(EngineConfig(model=str(models["llama"]), dtype="float32", tensor_parallel_size=2))
    try:
        params = SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True)
        for i in range(3):
            engine.add_request(f"r{i}", [5, 6, 7, 8], params)
        assert engine.peers is not None
        while not any(o.token_ids for o in engine.step()):
            pass  # streaming
        rank1 = engine.peers.procs[0]
        os.kill(rank1.pid, signal.SIGKILL)
        rank1.wait()
        with pytest.raises(TensorParallelLost, match="rank 1 exited"):
            engine.step()
    finally:
        engine.close()
    assert all(proc.poll() is not None for proc in engine.peers.procs)


def test_a_dead_rank_takes_its_process_engine_down_through_the_engine_lost_path() -> None:
    """Rank 1 of the worker process's engine killed mid-stream: the stream ends with EngineDeadError (the
    gateway's 503 + Retry-After), the engine reports dead, and no rank is left behind."""
    before = {p.pid for p in multiprocessing.active_children()}
    engine = ProcessEngine(EngineConfig(num_kv_blocks=96, tensor_parallel_size=2))  # the default model
    engine.start()
    try:
        (worker,) = [
            p
            for p in multiprocessing.active_children()
            if p.name == "fairserve-engine" and p.pid not in before
        ]
        assert worker.pid is not None
        (rank1,) = psutil.Process(worker.pid).children()

        async def scenario() -> None:
            params = SamplingParams(max_tokens=1500, ignore_eos=True)
            stream = engine.generate([1, 2, 3], params, RequestMeta(), "k")
            await anext(stream)
            rank1.kill()
            with pytest.raises(EngineDeadError, match="rank 1"):
                async for _ in stream:
                    pass

        asyncio.run(asyncio.wait_for(scenario(), timeout=10.0))
        assert not engine.is_alive and not engine.stats().alive
        worker.join(5)
        assert worker.exitcode is not None
    finally:
        engine.shutdown(timeout_s=5)


def test_a_rank_reads_only_its_slice_of_a_checkpoint_tensor(tmp_path: Path) -> None:
    full = torch.arange(6 * 8, dtype=torch.float32).reshape(6, 8)
    save_file({"w": full, "n": torch.ones(8)}, str(tmp_path / "model.safetensors"))
    files = [tmp_path / "model.safetensors"]
    rows = dict(iter_tensors(files, {"w": SourceSlice(0, 2, 3)}))
    assert torch.equal(rows["w"], full[2:5]) and torch.equal(rows["n"], torch.ones(8))
    assert torch.equal(dict(iter_tensors(files, {"w": SourceSlice(1, 4, 4)}))["w"], full[:, 4:])


RANK0 = """
import sys
from engine.worker import decode_graphs
from engine.config import EngineConfig
from engine.worker.decode_graphs import graph_batch_sizes
from engine.serving.llm_engine import LLMEngine
from engine.core.sampling_params import SamplingParams
engine = LLMEngine(EngineConfig(model=sys.argv[1], dtype="float32", tensor_parallel_size=2))
engine.add_request("r", [5, 6, 7], SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True))
engine.step()
print(engine.peers.procs[0].pid, flush=True)
while engine.has_unfinished():
    engine.step()
"""


def test_a_rank_does_not_outlive_its_engine(models: dict[str, Path]) -> None:
    rank0 = subprocess.Popen(
        [sys.executable, "-c", RANK0, str(models["llama"])], stdout=subprocess.PIPE, text=True
    )
    try:
        assert rank0.stdout is not None
        rank1 = psutil.Process(int(rank0.stdout.readline()))
        rank0.kill()  # mid-stream: rank 1 is in a step or waiting for one
        rank1.wait(timeout=20)
    finally:
        rank0.kill()
        rank0.wait()
