"""The step message rank 0 sends the other ranks carries everything their forward needs, copies included."""

from __future__ import annotations

import numpy as np
import torch

from engine.worker.host_batch import HostBatch
from engine.worker.rank_steps import StepMessage, step_batch, step_payload


def test_a_step_message_round_trips_the_batch_and_its_block_copies() -> None:
    batch = HostBatch(
        torch.tensor([5, 6, 7], dtype=torch.int64),
        torch.tensor([20, 21, 0], dtype=torch.int64),
        torch.tensor([84, 85, 12], dtype=torch.int64),
        torch.tensor([[3, 21], [3, 0]], dtype=torch.int32),
        torch.tensor([0, 2, 3], dtype=torch.int32),
        torch.tensor([22, 1], dtype=torch.int32),
        2,
        [1, 1, 2],  # a forked choice samples from its leader's row (row 1 twice)
        [],
        False,
    )
    batch.block_copies = [(21, 40), (21, 41)]
    got = step_batch(StepMessage(np.frombuffer(step_payload(batch, batch.ids), dtype=np.int64)))
    for name in ("ids", "positions", "slots", "table", "starts", "seq_lens"):
        assert torch.equal(getattr(got, name), getattr(batch, name)), name
    assert got.max_query_len == 2 and got.sample_rows == [1, 1, 2]
    assert got.block_copies == [(21, 40), (21, 41)]
