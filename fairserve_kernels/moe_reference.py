"""Torch fused-MoE: the CPU path of routed-expert layers and the oracle of the Triton kernel's tests.

Layouts (shared with fairserve_kernels/triton_moe.py):
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
    """Each expert's tokens gathered and run through its SwiGLU MLP, weighted; a token's top_k rows summed.

    Rows land in a per-(token, k) buffer with index_copy_ (a plain row copy) rather than index_add_ into
    the output, which on CPU costs tens of milliseconds a call; with top_k = 2 the sum is bit-identical.
    """
    inter = w2.shape[2]
    num_tokens, top_k = topk_ids.shape
    pair_out = torch.zeros(num_tokens * top_k, hidden.shape[1], dtype=hidden.dtype, device=hidden.device)
    flat_ids = topk_ids.reshape(-1)
    order = torch.argsort(flat_ids, stable=True)
    counts = torch.bincount(flat_ids, minlength=w13.shape[0]).tolist()
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        picks = order[start : start + count]
        start += count
        gate_up = F.linear(hidden.index_select(0, picks // top_k), w13[expert])
        act = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
        down = F.linear(act, w2[expert]) * topk_weights.reshape(-1)[picks].unsqueeze(1)
        pair_out.index_copy_(0, picks, down.to(pair_out.dtype))
    return pair_out.view(num_tokens, top_k, -1).sum(dim=1)


def route(router_logits: torch.Tensor, top_k: int, normalise: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over experts in float32, the top_k of them, optionally renormalised to sum to one;
    weights come back in the logits' dtype (as HF Qwen3-MoE does)."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if normalise:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(router_logits.dtype), ids
