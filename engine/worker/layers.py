"""Building blocks the decoders share: norms, rotary tables, the activation name and uninitialised linears."""

from __future__ import annotations

import math
from typing import NamedTuple, Protocol

import torch
from torch import nn

from engine.worker.kernels import Kernels
from engine.worker.model_config import ModelConfig
from fairserve_kernels.layer_reference import signed_sin


class SourceSlice(NamedTuple):
    """The part of a checkpoint tensor one tensor-parallel rank holds: `length` indices of `dim` from `start`."""

    dim: int
    start: int
    length: int


class Target(NamedTuple):
    """Where one HF tensor goes: rows [start, start + rows) of `param`; with tensor parallelism, only the
    `source` slice of the checkpoint tensor is read (None: the whole tensor, as on a single rank)."""

    param: torch.Tensor
    start: int
    rows: int
    source: SourceSlice | None = None


# HF tensor name -> where it goes.
WeightTargets = dict[str, Target]


class RMSNorm(nn.Module):
    """Root-mean-square norm computed in float32, weight applied in the model dtype (as HF Llama does).

    It runs through the backend's kernels (engine/worker/kernels.py): a Triton launch on CUDA, the torch twin
    on CPU; `add` fuses the residual add before it (vLLM's fused_add_rms_norm).
    """

    unit_offset = False  # Gemma's (1 + w) flavour sets it

    def __init__(self, size: int, eps: float, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(size, dtype=dtype, device=device))
        self.eps = eps

    def forward(self, x: torch.Tensor, ops: Kernels) -> torch.Tensor:
        """Normalise the last dimension of x ([N, hidden], or [N, heads, head_dim] for q/k norms)."""
        return ops.rms_norm(x, self.weight, self.eps, self.unit_offset)

    def add(self, x: torch.Tensor, residual: torch.Tensor, ops: Kernels) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual): a block's output joins the residual stream and is normed."""
        return ops.fused_add_rms_norm(x, residual, self.weight, self.eps, self.unit_offset)


class GemmaRMSNorm(RMSNorm):
    """Gemma's norm: the stored weight is an offset, (1 + w) scales, all in float32 before the cast back."""

    unit_offset = True


def rope_inv_freq(head_dim: int, theta: float, scaling: dict[str, object] | None) -> torch.Tensor:
    """Inverse frequencies of the rotary embedding, with linear or llama3 scaling applied."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scaling is None:
        return inv_freq
    factor = float(str(scaling["factor"]))
    if scaling["rope_type"] == "linear":
        return inv_freq / factor
    # llama3: keep high frequencies, divide low ones by `factor`, interpolate in between.
    low, high = float(str(scaling["low_freq_factor"])), float(str(scaling["high_freq_factor"]))
    old_len = float(str(scaling["original_max_position_embeddings"]))
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_len / high) & ~(wavelen > old_len / low)
    return torch.where(medium, smoothed, scaled)


def rope_tables(
    inv_freq: torch.Tensor, max_positions: int, device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sign-folded sin for every position, computed in float32 and kept in `dtype`, the model's
    compute dtype: HF casts the float32 values to it per forward, and a cast before the row gather equals
    one after it, so a forward gathers them without a cast kernel per table.

    The sign fold (fairserve_kernels.layer_reference.signed_sin) makes rotate-half one `roll` in the
    torch twin and a sign-free multiply-add in the Triton kernel.
    """
    freqs = torch.outer(torch.arange(max_positions).float(), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(device, dtype), signed_sin(emb.sin()).to(device, dtype)


def gated_activation(hidden_act: str) -> str:
    """The kernels' name (fairserve_kernels.layer_reference.GATED_ACTIVATIONS) of an HF `hidden_act`."""
    return "gelu_tanh" if hidden_act == "gelu_pytorch_tanh" else "silu"


def norm_class(cfg: ModelConfig) -> type[RMSNorm]:
    """The RMSNorm flavour of an architecture."""
    return GemmaRMSNorm if cfg.architecture == "gemma3" else RMSNorm


class _UninitialisedLinear(nn.Linear):
    """nn.Linear whose parameters are allocated but not initialised: load_weights fills every one of them.

    Not torch.nn.utils.skip_init: that runs the random init on the meta device, through torch's Python
    reference implementations, which cost about a second of every engine worker start (docs/engine.md).
    """

    def reset_parameters(self) -> None:
        """Nothing: the weights come from the checkpoint or the seeded default model."""


def linear(n_in: int, n_out: int, bias: bool, dtype: torch.dtype, device: torch.device) -> nn.Linear:
    """An uninitialised nn.Linear (see _UninitialisedLinear)."""
    return _UninitialisedLinear(n_in, n_out, bias=bias, dtype=dtype, device=device)


class Projection(Protocol):
    """A linear's parameters: nn.Linear, or a tensor-parallel one (engine/worker/parallel/layers.py)."""

    @property
    def weight(self) -> torch.Tensor: ...

    @property
    def bias(self) -> torch.Tensor | None: ...


def linear_targets(
    prefix: str, layer: Projection, start: int, rows: int, source: SourceSlice | None = None
) -> WeightTargets:
    """Targets of one HF linear (`prefix`.weight and, when the layer has one, `prefix`.bias) in a fused layer.

    `source`: the rank's slice of the weight; a column-parallel slice (dim 0) cuts the bias too, a
    row-parallel one (dim 1) leaves it whole (it is added once, after the all-reduce).
    """
    targets: WeightTargets = {f"{prefix}.weight": Target(layer.weight, start, rows, source)}
    if layer.bias is not None:
        bias_source = source if source is not None and source.dim == 0 else None
        targets[f"{prefix}.bias"] = Target(layer.bias, start, rows, bias_source)
    return targets
