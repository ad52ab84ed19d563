"""The layers that differ under tensor parallelism: row-parallel linears and the vocab-parallel embedding
and LM head. Column-parallel linears need no class: they are plain linears with a slice of the output rows
(the weight targets say which, engine/worker/layers.py `SourceSlice`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.worker.layers import linear
from engine.worker.parallel.group import TPGroup, even_split, vocab_split


class RowParallelLinear(nn.Module):
    """A linear over this rank's slice of the input features; partial products are summed over the ranks,
    then the (replicated) bias is added once."""

    def __init__(
        self, n_in: int, n_out: int, bias: bool, dtype: torch.dtype, device: torch.device, tp: TPGroup
    ) -> None:
        super().__init__()
        _, local = even_split(n_in, tp.rank, tp.world, "the row-parallel input size")
        inner = linear(local, n_out, bias, dtype, device)
        self.weight, self.bias = inner.weight, inner.bias
        self.out_features = n_out
        self.tp = tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [N, n_in / world] -> [N, n_out], identical on every rank."""
        out = self.tp.all_reduce(F.linear(x, self.weight))
        return out if self.bias is None else out + self.bias


class VocabParallelEmbedding(nn.Module):
    """Rows [start, start + ceil(vocab / world)) of the embedding; a token outside them contributes zeros,
    and the all-reduce leaves every rank with each token's one real row."""

    def __init__(
        self, vocab: int, hidden: int, dtype: torch.dtype, device: torch.device, tp: TPGroup
    ) -> None:
        super().__init__()
        self.start, self.rows, self.real_rows = vocab_split(vocab, tp.rank, tp.world)
        # The loader fills the real rows; padding rows (last rank, vocab not divisible) stay zero.
        self.weight = nn.Parameter(torch.zeros(self.rows, hidden, dtype=dtype, device=device))
        self.tp = tp

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids: [N] global token ids -> [N, hidden]."""
        local = ids - self.start
        outside = (local < 0) | (local >= self.rows)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        return self.tp.all_reduce(out.masked_fill_(outside.unsqueeze(-1), 0))


class ParallelLMHead(nn.Module):
    """This rank's vocabulary rows of the LM head; the logits of every rank are gathered in vocab order
    (and the padding rows' cut off)."""

    def __init__(
        self, vocab: int, hidden: int, dtype: torch.dtype, device: torch.device, tp: TPGroup
    ) -> None:
        super().__init__()
        self.vocab = vocab
        self.start, self.rows, self.real_rows = vocab_split(vocab, tp.rank, tp.world)
        self.weight = nn.Parameter(torch.zeros(self.rows, hidden, dtype=dtype, device=device))
        self.tp = tp

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [M, hidden] -> logits [M, vocab] on every rank."""
        return self.tp.all_gather_last(F.linear(hidden, self.weight))[..., : self.vocab]
