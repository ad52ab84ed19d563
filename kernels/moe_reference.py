"""Torch fused-MoE: the CPU path of routed-expert layers and the oracle of the Triton kernel's tests.

Layouts (shared with kernels/triton_moe.py):
  hidden        [num_tokens, hidden]
  w13           [num_experts, 2 * inter, hidden]   gate rows then up rows, as `nn.Linear` weights
  w2            [num_experts, hidden, inter]
  topk_weights  [num_tokens, top_k] routing weight of each chosen expert (in hidden's dtype)
  topk_ids      [num_tokens, top_k] int expert ids
Output [num_tokens, hidden] = sum over k of topk_weights[t, k] * w2[e] @ (silu(gate) * up)(w13[e] @ hidden[t]).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def fused_moe_ref(
    hidden: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> torch.Tensor:
    """Each expert's tokens gathered, run through its SwiGLU MLP, weighted and added back in place."""
    inter = w2.shape[2]
    out = torch.zeros_like(hidden)
    flat_ids = topk_ids.reshape(-1)
    order = torch.argsort(flat_ids, stable=True)
    counts = torch.bincount(flat_ids, minlength=w13.shape[0]).tolist()
    top_k = topk_ids.shape[1]
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        picks = order[start : start + count]
        start += count
        tokens = picks // top_k
        gate_up = F.linear(hidden.index_select(0, tokens), w13[expert])
        act = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
        down = F.linear(act, w2[expert]) * topk_weights.reshape(-1)[picks].unsqueeze(1)
        out.index_add_(0, tokens, down.to(out.dtype))
    return out


def route(router_logits: torch.Tensor, top_k: int, normalise: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over experts in float32, the top_k of them, optionally renormalised to sum to one;
    weights come back in the logits' dtype (as HF Qwen3-MoE does)."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if normalise:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(router_logits.dtype), ids
