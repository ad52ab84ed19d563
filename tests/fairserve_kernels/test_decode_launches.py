"""The kernels a decode step launches inside its CUDA graph, counted on CPU (tests/fairserve_kernels/launch_count.py).

The 0.85B Llama of experiments/gpu_engine.py (32 query heads over 8 kv heads, SiLU, an untied head), narrowed
(the count does not depend on the widths): one replay of a decode graph on the Triton backend (interpreted)
is counted with one layer and with two, so the difference is one layer's kernels and the rest is what runs
outside the layers. The budgets are issue 57's; what the step launches today is in docs/kernels.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

import engine
import engine.worker.decode_graphs as decode_graphs
import engine.worker.kernels
from engine.core.byte_tokenizer import write_byte_tokenizer
from engine.worker.decode_graphs import Replay
from tests.fairserve_kernels.conftest import ON_CUDA
from tests.fairserve_kernels.launch_count import LaunchCount, counting

pytestmark = pytest.mark.skipif(
    ON_CUDA, reason="counts the interpreter's launches; on CUDA the profiler counts"
)

# Issue 57's budget: 9 a layer, 4 GEMMs and 5 Triton launches (two fused add+norms, the rotary with the KV
# store folded in, attention, SiLU-and-mul).
PER_LAYER_BUDGET = 9
OUTSIDE_BUDGET = 8
GEOMETRY: dict[str, Any] = {  # experiments/gpu_engine.py's MODEL_GEOMETRY, narrowed
    "hidden_size": 512,
    "intermediate_size": 1024,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 16,
    "vocab_size": 300,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
}


def _model(root: Path, layers: int) -> Path:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(**GEOMETRY, num_hidden_layers=layers)
    transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(root)
    write_byte_tokenizer(root)
    return root


def _replay_counts(root: Path, monkeypatch: pytest.MonkeyPatch) -> list[LaunchCount]:
    """Every decode replay of a short greedy run of three requests (the bucket of four), counted."""
    counts: list[LaunchCount] = []

    def capture_for(device: torch.device) -> decode_graphs.Capture:
        def capture(run: Replay) -> Replay:
            def replay() -> None:
                with counting() as count:
                    run()
                counts.append(count)

            return replay

        return capture

    monkeypatch.setattr(decode_graphs, "capture_for", capture_for)
    monkeypatch.setattr(
        decode_graphs, "batch_sizes", lambda seats, device: decode_graphs.graph_batch_sizes(seats)
    )
    engine.worker.kernels.clear_cache()
    # fp16 (the interpreter has no bf16): a cast the float32 model would skip is counted.
    llm = engine.LLM(str(root), attention_backend="triton", dtype="float16", max_num_seqs=4, seed=0)
    params = engine.SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    llm.generate(["ab", "cde", "fghi"], params)
    engine.worker.kernels.clear_cache()
    assert counts, "no decode step replayed a graph"
    return counts


@pytest.fixture(scope="module")
def replays(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[int, list[LaunchCount]]]:
    with pytest.MonkeyPatch.context() as monkeypatch:
        yield {
            layers: _replay_counts(_model(tmp_path_factory.mktemp(f"l{layers}"), layers), monkeypatch)
            for layers in (1, 2)
        }


def test_a_decode_step_launches_within_the_budget(replays: dict[int, list[LaunchCount]]) -> None:
    one, two = replays[1][-1], replays[2][-1]
    per_layer = two.total - one.total
    outside = one.total - per_layer
    described = f"one layer: {one.torch_ops} {one.triton}; two: {two.torch_ops} {two.triton}"
    assert per_layer <= PER_LAYER_BUDGET, f"{per_layer} kernels a layer; {described}"
    assert outside <= OUTSIDE_BUDGET, f"{outside} kernels outside the layers; {described}"
    # Every layer kernel is a Triton launch or a GEMM: attention, the rotary and its store in one launch,
    # both norms, act-and-mul.
    layer_triton = two.triton - one.triton
    assert set(layer_triton) >= {"_paged_attention_kernel", "_rotary_store_kernel"}, layer_triton
    assert "_store_kv_kernel" not in layer_triton and "_rotary_kernel" not in layer_triton, layer_triton
    # Outside the layers: the embedding, the rope rows (tables kept in the compute dtype: no cast), the
    # final norm, the LM head and one cast-and-copy into the float32 logits buffer.
    assert "_to_copy" not in one.torch_ops and one.torch_ops["copy_"] == 1, described


def test_no_host_sync_inside_the_captured_region(replays: dict[int, list[LaunchCount]]) -> None:
    for counts in replays.values():
        for count in counts:
            assert count.syncs == [], count.syncs
