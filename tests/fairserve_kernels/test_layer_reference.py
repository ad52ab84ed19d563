"""The layer twins against transformers' own modules, in bfloat16: they round where HF rounds.

The model parity tests (tests/engine/worker/test_models.py) compare whole models in float32; here each twin
meets the HF piece it replaces at the dtype where rounding order shows.
"""

from __future__ import annotations

import pytest
import torch
from transformers.activations import ACT2FN
from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb

from fairserve_kernels.layer_reference import (
    act_and_mul_ref,
    fused_add_rms_norm_ref,
    rms_norm_ref,
    rotary_embedding_ref,
    signed_sin,
)

GEN = torch.Generator().manual_seed(11)
DTYPE = torch.bfloat16


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=GEN).to(DTYPE)


@pytest.mark.parametrize("gemma", [False, True])
def test_norms_equal_hf(gemma: bool) -> None:
    hf = (Gemma3RMSNorm if gemma else LlamaRMSNorm)(96, eps=1e-6).to(DTYPE)
    with torch.no_grad():
        hf.weight.copy_(_randn(96) * 0.3 + (0.0 if gemma else 1.0))
    x, residual = _randn(5, 96) * 4, _randn(5, 96)
    with torch.no_grad():
        assert torch.equal(rms_norm_ref(x, hf.weight, 1e-6, gemma), hf(x))
        normed, summed = fused_add_rms_norm_ref(x, residual, hf.weight, 1e-6, gemma)
        assert torch.equal(summed, x + residual) and torch.equal(normed, hf(x + residual))


def test_rotary_equals_hf() -> None:
    q, k = _randn(1, 4, 7, 64), _randn(1, 2, 7, 64)  # HF's [batch, heads, tokens, D]
    inv_freq = 1.0 / 10000 ** (torch.arange(0, 64, 2).float() / 64)
    freqs = torch.outer(torch.arange(7).float() * 13, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(DTYPE), emb.sin().to(DTYPE)
    hf_q, hf_k = apply_rotary_pos_emb(q, k, cos[None], sin[None])
    qk = torch.cat((q[0], k[0])).transpose(0, 1)  # ours: [tokens, Hq + Hk, D]
    ours = rotary_embedding_ref(qk, cos, signed_sin(sin))
    assert torch.equal(ours, torch.cat((hf_q[0], hf_k[0])).transpose(0, 1))


@pytest.mark.parametrize(("ours", "hf"), [("silu", "silu"), ("gelu_tanh", "gelu_pytorch_tanh")])
def test_act_and_mul_equals_hf(ours: str, hf: str) -> None:
    gate, up = _randn(5, 40) * 3, _randn(5, 40)
    assert torch.equal(act_and_mul_ref(torch.cat((gate, up), -1), ours), ACT2FN[hf](gate) * up)


def test_unknown_activation_is_named() -> None:
    with pytest.raises(ValueError, match="activation must be one of silu, gelu_tanh"):
        act_and_mul_ref(torch.zeros(2, 4), "relu")
