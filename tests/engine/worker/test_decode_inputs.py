"""A replayed decode step's inputs reach the static buffers (engine/worker/decode_inputs.py) in one upload."""

from __future__ import annotations

import pytest
import torch

import engine.worker.decode_inputs as decode_inputs
from tests.engine.test_engine_parity import workload
from tests.engine.worker.test_decode_graphs import cuda_buckets, graph_and_eager, tokens

__all__ = ["cuda_buckets"]  # the CUDA buckets on CPU too (an autouse fixture of the graph tests)


def test_a_replayed_step_uploads_its_inputs_in_one_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ids, positions, slots, lengths and the block table travel in one host-to-device copy a step (pinned
    and non-blocking on CUDA: `_upload`), with async scheduling's in-flight ids filled on the device; the
    tokens stay the eager path's."""
    uploads: list[int] = []
    upload = decode_inputs._upload

    def counted(buffer: torch.Tensor, values: torch.Tensor) -> None:
        uploads.append(values.numel())
        upload(buffer, values)

    monkeypatch.setattr(decode_inputs, "_upload", counted)
    items = workload(6, seed=9)
    llm, graphed, eager = graph_and_eager(None, items, max_num_seqs=6, async_scheduling="on")
    graphs = llm.engine.runner.graphs
    assert graphs is not None and len(uploads) == graphs.replayed_steps > 0
    assert tokens(graphed) == tokens(eager)
