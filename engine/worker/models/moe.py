"""Qwen3-MoE's routed-expert MLP: a router picks top_k experts per token, their SwiGLU outputs are mixed.

Expert weights are held fused, [experts, 2 * inter, hidden] (gate rows then up rows) and
[experts, hidden, inter], the layout of the fused-MoE kernels: the torch twin
(fairserve_kernels/moe_reference.py) and one Triton grouped GEMM per projection
(fairserve_kernels/triton_moe.py), picked by the backend like every other kernel (engine/worker/kernels.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.worker.kernels import Kernels
from engine.worker.layers import SourceSlice, Target, WeightTargets
from engine.worker.model_config import ModelConfig
from engine.worker.parallel.group import TPGroup, even_split
from fairserve_kernels.moe_reference import route


class SparseMoeBlock(nn.Module):
    """Router plus experts; each token's output is the routing-weighted sum of its top_k experts' MLPs."""

    def __init__(
        self, cfg: ModelConfig, dtype: torch.dtype, device: torch.device, tp: TPGroup | None = None
    ) -> None:
        super().__init__()
        self.num_experts, self.top_k = cfg.num_experts, cfg.num_experts_per_tok
        self.normalise = cfg.norm_topk_prob
        # Tensor parallelism shards every expert (its intermediate rows, like the dense MLP), so each rank
        # runs every routed token through its slice of the chosen experts and the outputs are summed: the
        # load is even whatever the router picks. The router is replicated.
        self.tp = tp
        self.inter_start, self.inter = (
            even_split(cfg.moe_intermediate_size, tp.rank, tp.world, "moe_intermediate_size")
            if tp is not None
            else (0, cfg.moe_intermediate_size)
        )
        hidden = cfg.hidden_size
        # Allocated, not initialised: load_weights fills every expert.
        self.gate = nn.Parameter(torch.empty(self.num_experts, hidden, dtype=dtype, device=device))
        self.w13 = nn.Parameter(
            torch.empty(self.num_experts, 2 * self.inter, hidden, dtype=dtype, device=device)
        )
        self.w2 = nn.Parameter(torch.empty(self.num_experts, hidden, self.inter, dtype=dtype, device=device))

    def forward(self, x: torch.Tensor, ops: Kernels) -> torch.Tensor:
        """x: [N, hidden] -> [N, hidden]."""
        weights, ids = route(F.linear(x, self.gate), self.top_k, self.normalise)
        out = ops.fused_moe(x, self.w13, self.w2, weights, ids)
        return out if self.tp is None else self.tp.all_reduce(out)

    def weight_targets(self, prefix: str) -> WeightTargets:
        """HF names: `mlp.gate.weight` and `mlp.experts.<e>.{gate,up,down}_proj.weight`."""
        hidden, inter = self.w2.shape[1], self.inter
        rows = cols = None
        if self.tp is not None:  # this rank's intermediate rows of gate/up, columns of down
            rows, cols = SourceSlice(0, self.inter_start, inter), SourceSlice(1, self.inter_start, inter)
        targets: WeightTargets = {f"{prefix}.gate.weight": Target(self.gate, 0, self.num_experts)}
        for e in range(self.num_experts):
            p = f"{prefix}.experts.{e}"
            targets[f"{p}.gate_proj.weight"] = Target(self.w13[e], 0, inter, rows)
            targets[f"{p}.up_proj.weight"] = Target(self.w13[e], inter, inter, rows)
            targets[f"{p}.down_proj.weight"] = Target(self.w2[e], 0, hidden, cols)
        return targets
