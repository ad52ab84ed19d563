"""The stacked slots the SGMV kernels read: zero-padded ranks, per-slot scale, put replaces, drop empties."""

from __future__ import annotations

import pytest
import torch

from engine.worker.lora.adapter import LoraAdapter
from engine.worker.lora.stack import LoraStack
from engine.worker.model_config import ModelConfig

CFG = ModelConfig("LlamaForCausalLM", 50, 32, 48, 2, 4, 2, 8)  # hidden 32, q 32, kv 16, intermediate 48


def _adapter(name: str, rank: int, keys: list[tuple[int, str]], scale: float) -> LoraAdapter:
    shapes = {"q_proj": (32, 32), "v_proj": (32, 16), "down_proj": (48, 32)}
    weights = {
        (layer, module): (torch.randn(rank, shapes[module][0]), torch.randn(shapes[module][1], rank))
        for layer, module in keys
    }
    return LoraAdapter(name, rank, scale, weights)


def test_put_pads_the_rank_with_zeros_and_keeps_other_slots() -> None:
    stack = LoraStack(CFG, slots=3, max_rank=8, dtype=torch.float32, device=torch.device("cpu"))
    small = _adapter("small", 2, [(0, "q_proj"), (1, "down_proj")], 4.0)
    full = _adapter("full", 8, [(0, "q_proj")], 0.5)
    stack.put(0, small)
    stack.put(2, full)
    q0 = stack.get(0, "q_proj")
    assert q0 is not None
    torch.testing.assert_close(q0.a[0, :2], small.weights[0, "q_proj"][0])
    torch.testing.assert_close(q0.b[0, :, :2], small.weights[0, "q_proj"][1])
    assert not q0.a[0, 2:].any() and not q0.b[0, :, 2:].any()
    torch.testing.assert_close(q0.a[2], full.weights[0, "q_proj"][0])
    assert not q0.a[1].any()  # an empty slot is all zero
    assert stack.get(0, "v_proj") is None  # no resident adapter targets it: the forward skips it
    assert not stack.modules[0, "v_proj"].a.any()
    assert stack.scales.tolist() == [4.0, 0.0, 0.5]
    assert stack.resident == ["small", None, "full"]


def test_put_over_a_slot_replaces_and_drop_empties() -> None:
    stack = LoraStack(CFG, slots=2, max_rank=4, dtype=torch.float32, device=torch.device("cpu"))
    stack.put(1, _adapter("first", 4, [(1, "down_proj")], 2.0))
    second = _adapter("second", 3, [(0, "v_proj")], 1.0)
    stack.put(1, second)
    down, v0 = stack.modules[1, "down_proj"], stack.get(0, "v_proj")
    assert v0 is not None and stack.get(1, "down_proj") is None
    assert not down.a[1].any()  # the first adapter's module is gone
    torch.testing.assert_close(v0.b[1, :, :3], second.weights[0, "v_proj"][1])
    stack.drop(1)
    assert stack.get(0, "v_proj") is None
    assert not v0.a.any() and not v0.b.any() and stack.scales.tolist() == [0.0, 0.0]
    assert stack.resident == [None, None]


def test_a_rank_over_the_stack_or_a_slot_outside_it_is_refused() -> None:
    stack = LoraStack(CFG, slots=2, max_rank=4, dtype=torch.float32, device=torch.device("cpu"))
    with pytest.raises(ValueError, match="rank 8 exceeds the stack's 4"):
        stack.put(0, _adapter("big", 8, [(0, "q_proj")], 1.0))
    with pytest.raises(IndexError, match="slot 2 is outside 0..1"):
        stack.drop(2)
