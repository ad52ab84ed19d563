"""experiments.gpu_engine never reports eager figures as graph figures (run on CPU, where the engine's
"capture" is the eager forward over the static buffers: the same bookkeeping as on CUDA)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

import engine.worker.decode_graphs as decode_graphs
from engine.core.byte_tokenizer import write_byte_tokenizer
from experiments.gpu_engine import GraphsNotCaptured, engine_run
from tests.engine.test_engine_parity import COMMON

PROMPTS = [[5, 6, 7, 8], [9, 10, 11]]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("llama")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(**COMMON)
    transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(root)
    write_byte_tokenizer(root)
    return root


def test_graphs_asked_for_and_not_captured_fail_the_row(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(device: torch.device) -> decode_graphs.Capture:
        def capture(run: decode_graphs.Replay) -> decode_graphs.Replay:
            raise RuntimeError("operation not permitted when stream is capturing")

        return capture

    monkeypatch.setattr(decode_graphs, "capture_for", broken)
    with pytest.raises(GraphsNotCaptured, match="not captured"):
        engine_run(model_dir, PROMPTS, "torch", eager=False, device="cpu")
    run = engine_run(model_dir, PROMPTS, "torch", eager=True, device="cpu")  # eager was asked for: fine
    assert all(len(o.token_ids) == 3 for o in run(3))


def test_captured_graphs_that_replay_pass(model_dir: Path) -> None:
    run = engine_run(model_dir, PROMPTS, "torch", eager=False, device="cpu")
    assert all(len(o.token_ids) == 3 for o in run(3))
