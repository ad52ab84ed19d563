"""Every architecture of the model table on the Triton backend (interpreted on CPU) against the torch twins.

Same model, same weights, same flat batch (a prefill chunk and a decode over cached context); only
`AttentionMetadata.backend` differs, so this is the dispatch of engine/worker/kernels.py at work: each Triton
layer kernel must be launched on the Triton backend and none on the torch one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

import engine.worker.kernels
from engine.worker.attention import AttentionMetadata
from engine.worker.models import ModelConfig, build_model
from fairserve_kernels import triton_activation, triton_moe, triton_norm, triton_rotary

BLOCK_SIZE = 8
BASE: dict[str, Any] = {
    "vocab_size": 50,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
}
CONFIGS: dict[str, dict[str, Any]] = {
    "llama": {"architectures": ["LlamaForCausalLM"], "attention_bias": True},
    "qwen2": {"architectures": ["Qwen2ForCausalLM"]},
    "mistral": {"architectures": ["MistralForCausalLM"], "sliding_window": 4},
    "qwen3": {"architectures": ["Qwen3ForCausalLM"], "head_dim": 32},
    "qwen3_moe": {
        "architectures": ["Qwen3MoeForCausalLM"],
        "head_dim": 32,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "norm_topk_prob": True,
        "mlp_only_layers": [1],
    },
    "gemma3": {
        "architectures": ["Gemma3ForCausalLM"],
        "head_dim": 32,
        "sliding_window": 4,
        "sliding_window_pattern": 2,
        "query_pre_attn_scalar": 32,
        "hidden_activation": "gelu_pytorch_tanh",
    },
}
# (module, function) of every layer kernel, and the architectures that must launch it.
LAYER_KERNELS: list[tuple[Any, str, set[str]]] = [
    (triton_norm, "rms_norm", set(CONFIGS)),
    (triton_norm, "fused_add_rms_norm", set(CONFIGS)),
    (triton_rotary, "rotary_store", set(CONFIGS)),  # the rotary with the KV store folded in
    (triton_activation, "act_and_mul", set(CONFIGS)),
    (triton_moe, "fused_moe", {"qwen3_moe"}),
]


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    """Counts of each layer kernel's launches, through a Triton table rebuilt from the patched modules."""
    counts = dict.fromkeys((name for _, name, _ in LAYER_KERNELS), 0)

    def counting(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return fn(*args, **kwargs)

        return run

    for module, name, _ in LAYER_KERNELS:
        monkeypatch.setattr(module, name, counting(name, getattr(module, name)))
    engine.worker.kernels.clear_cache()
    yield counts
    engine.worker.kernels.clear_cache()


def _model(arch: str) -> tuple[Any, ModelConfig]:
    cfg = ModelConfig.from_hf_config(BASE | CONFIGS[arch])
    model = build_model(cfg, torch.float32, torch.device("cpu"))
    gen = torch.Generator().manual_seed(len(arch))
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen)
            param.copy_(1.0 + 0.1 * noise if "norm" in name else 0.2 * noise)
    return model, cfg


def _forward(model: Any, cfg: ModelConfig, backend: str) -> torch.Tensor:
    """Prefill 11 tokens of sequence 0 and 6 of sequence 1, then one batch: a decode of 0 and a chunk of 1."""
    shape = (8, BLOCK_SIZE, cfg.num_kv_heads, cfg.head_dim)
    caches = [(torch.zeros(shape), torch.zeros(shape)) for _ in range(cfg.num_layers)]
    tables = torch.tensor([[3, 0, 5, 7], [1, 6, 2, 4]])
    gen = torch.Generator().manual_seed(0)
    outputs = []
    for spans in ([(0, 11), (0, 6)], [(11, 1), (6, 5)]):
        positions = torch.cat([torch.arange(start, start + n) for start, n in spans])
        seq = torch.cat([torch.full((n,), i) for i, (_, n) in enumerate(spans)])
        slots = tables[seq, positions // BLOCK_SIZE] * BLOCK_SIZE + positions % BLOCK_SIZE
        lens = [start + n for start, n in spans]
        meta = AttentionMetadata(
            slot_mapping=slots,
            block_tables=tables,
            query_start_loc=torch.tensor([0, spans[0][1], spans[0][1] + spans[1][1]]),
            seq_lens=torch.tensor(lens),
            max_query_len=max(n for _, n in spans),
            max_seq_len=max(lens),
            backend=backend,
        )
        ids = torch.randint(0, cfg.vocab_size, (len(positions),), generator=gen)
        with torch.no_grad():
            outputs.append(model.compute_logits(model(ids, positions, caches, meta)))
    return torch.cat(outputs)


@pytest.mark.parametrize("arch", list(CONFIGS))
def test_triton_layers_match_torch_twins(arch: str, launches: dict[str, int]) -> None:
    model, cfg = _model(arch)
    expected = _forward(model, cfg, "torch")
    assert not any(launches.values()), f"the torch backend launched Triton kernels: {launches}"
    got = _forward(model, cfg, "triton")
    torch.testing.assert_close(got, expected, atol=2e-4, rtol=2e-4)
    for _, name, users in LAYER_KERNELS:
        assert (launches[name] > 0) == (arch in users), f"{name}: {launches[name]} launches for {arch}"
