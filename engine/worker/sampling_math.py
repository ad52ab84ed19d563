"""The sampler's tensor work for a whole batch at once, on the logits' device: no Python loop over rows.

Every function takes per-row parameters as tensors already on the logits' device, so nothing here reads
a value back to the host: on a GPU the whole of sampling is queued behind the forward pass, and the only
wait is the one copy of the results that `Sampler` makes at the end (engine/worker/sampler.py). Which work a
batch needs (top-k at all, top-p at all, the widest k) the host decides from the parameters it read.

The processing order is vLLM's: logit bias, then the penalties (`penalize`: repetition over prompt and
output, presence and frequency over the output), then temperature, then min-p, then top-k, then top-p on
what top-k kept. The result is the distribution a row samples from, and its log-softmax is what
`logprobs` reports (docs/engine.md, "Sampling").

When every row of the batch has a top-k, the rows are cut to their candidates (one `topk` to the widest
k, most likely first) and everything after works on [rows, k] instead of [rows, vocab]: top-p needs no
sort of the vocabulary, and the softmax, the noise and the draw are k/vocab of the work (on a CPU, 64
rows of a 32,000-token vocabulary cost about 130 ms to sort and 50 ms to draw from in full).

Sampling is the exponential race: token = argmax(p_i / E_i) with E_i ~ Exp(1) independent, which picks
token i with probability p_i / sum(p) (the minimum of independent Exp(p_i) variables is the i-th with
that probability). Unlike `torch.multinomial` it is one batched argmax, and the noise of a row can come
from that row's own seeded generator while every other row's comes from one shared draw.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import torch

NEG_INF = float("-inf")


class Nucleus(Enum):
    """Where top-p runs, as the host decided from the rows' parameters."""

    NONE = "none"  # no row has top_p < 1
    FULL = "full"  # over each row's whole vocabulary (a sort of it)
    CANDIDATES = "candidates"  # every row has a top-k: over its candidates, already in order


@dataclass(slots=True)
class Distribution:
    """What each row samples from: log-weights, -inf for every token its top-k or top-p excluded.

    With `ids` None a column is the token id; otherwise column j of a row is the token `ids[row, j]` (the
    row's candidates, most likely first), and a token not among them has probability 0.
    """

    scores: torch.Tensor
    ids: torch.Tensor | None

    def rows(self, index: torch.Tensor) -> Distribution:
        """The distributions of some rows (index_select: tensor indexing is slower at these sizes)."""
        ids = None if self.ids is None else self.ids.index_select(0, index)
        return Distribution(self.scores.index_select(0, index), ids)

    def tokens(self, columns: torch.Tensor) -> torch.Tensor:
        """The token ids of columns: [rows] (one per row) or [rows, c]."""
        if self.ids is None:
            return columns
        if columns.dim() == 1:
            return self.ids.gather(1, columns.unsqueeze(1)).squeeze(1)
        return self.ids.gather(1, columns)


def penalize(
    scores: torch.Tensor,
    prompt_ids: torch.Tensor,
    output_ids: torch.Tensor,
    presence: torch.Tensor,
    frequency: torch.Tensor,
    repetition: torch.Tensor,
) -> torch.Tensor:
    """Each row's scores after its penalties, as vLLM computes them (and OpenAI defines presence and frequency).

    scores: [rows, vocab] float32; prompt_ids [rows, P] and output_ids [rows, O]: int64 token ids, each row
    padded with `vocab` (a column past the vocabulary, dropped); presence, frequency: [rows] in [-2, 2];
    repetition: [rows] > 0, 1 for none. A token seen in the prompt or the output has its score divided by
    the repetition penalty when positive and multiplied by it otherwise (transformers'
    RepetitionPenaltyLogitsProcessor); a token of the output then loses `frequency` per occurrence and
    `presence` once. One scatter per id tensor builds the counts for every row: no loop over rows or tokens.
    """
    rows, vocab = scores.shape
    counts = torch.zeros((rows, vocab + 1), dtype=scores.dtype, device=scores.device)
    counts.scatter_add_(1, output_ids, torch.ones(output_ids.shape, dtype=scores.dtype, device=scores.device))
    counts = counts[:, :vocab]
    in_output = counts > 0
    seen = torch.zeros((rows, vocab + 1), dtype=torch.bool, device=scores.device)
    seen.scatter_(1, prompt_ids, True)
    seen = seen[:, :vocab] | in_output
    rep = repetition.unsqueeze(1)
    scores = torch.where(seen, torch.where(scores > 0, scores / rep, scores * rep), scores)
    return scores - frequency.unsqueeze(1) * counts - presence.unsqueeze(1) * in_output.to(scores.dtype)


def process(
    scores: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    widest_k: int,
    nucleus: Nucleus,
    min_p: torch.Tensor | None = None,
) -> Distribution:
    """Scale each row by its temperature and cut it to its top-k and top-p.

    scores: [rows, vocab] float32 (logit bias already added); temperature: [rows] float32 > 0;
    top_k: [rows] int64, 0 disables, at most `widest_k` (0: no row has one); top_p: [rows] float32 in
    (0, 1], 1 disables; min_p: [rows] float32 in [0, 1], 0 disables (None: no row has one).
    Nucleus.CANDIDATES asks for the rows cut to their candidates (every row then has a top-k in
    [1, widest_k]).
    """
    # Shift so the largest score is 0 before dividing: a tiny temperature then yields very negative
    # numbers (exp -> 0), never +inf (softmax -> nan), so every validated temperature samples.
    scores = (scores - scores.amax(dim=-1, keepdim=True)) / temperature.unsqueeze(1)
    if min_p is not None:
        scores = _min_p(scores, min_p)
    if 0 < widest_k < scores.shape[-1]:
        top = torch.topk(scores, widest_k, dim=-1)  # sorted: each row's candidates, most likely first
        limited = (top_k > 0) & (top_k <= widest_k)
        columns = torch.arange(widest_k, device=scores.device)
        beyond = (columns.unsqueeze(0) >= top_k.unsqueeze(1)) & limited.unsqueeze(1)
        candidates = top.values.masked_fill(beyond, NEG_INF)
        if nucleus is Nucleus.CANDIDATES:
            return Distribution(_nucleus(candidates, top_p), top.indices)
        # Every token but a limited row's first k goes (a tie with the k-th past it too, as in the
        # candidates' form, so both forms draw alike).
        kept = torch.full_like(scores, NEG_INF).scatter(1, top.indices, candidates)
        scores = torch.where(limited.unsqueeze(1), kept, scores)
    if nucleus is not Nucleus.NONE:
        ordered, order = scores.sort(dim=-1, descending=True)
        scores = scores.scatter(1, order, _nucleus(ordered, top_p))
    return Distribution(scores, None)


def _min_p(scores: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """`scores` (temperature applied, each row's largest 0) with every token less likely than min_p times
    the row's most likely set to -inf (transformers' MinPLogitsWarper; the most likely always stays). With
    the largest score 0, p / p_max is exp(score), so no softmax is needed."""
    return scores.masked_fill(scores.exp() < min_p.unsqueeze(1), NEG_INF)


def _nucleus(ordered: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """`ordered` (each row's scores, largest first) with every token past the row's top-p set set to -inf:
    the smallest most-likely prefix whose probability reaches top_p stays (the first always does)."""
    probs = torch.softmax(ordered, dim=-1)
    # A token goes when the mass before it already reaches top_p; rows with top_p = 1 drop nothing (their
    # cumulative sum can pass 1 by rounding, which would otherwise drop a tail token).
    drop = ((probs.cumsum(dim=-1) - probs) > top_p.unsqueeze(1)) & (top_p < 1.0).unsqueeze(1)
    return ordered.masked_fill(drop, NEG_INF)


def exponential_noise(uniform: torch.Tensor) -> torch.Tensor:
    """Exp(1) draws from U[0, 1) draws, in place: -log(u). (`Tensor.exponential_` is 5x slower on a CPU;
    u < 1 keeps every draw above 0, so p / noise stays finite.)"""
    return uniform.log_().neg_()


def race(dist: Distribution, noise: torch.Tensor) -> torch.Tensor:
    """One token per row drawn from softmax(dist.scores), given Exp(1) noise of the same shape (int64 ids)."""
    probs = torch.softmax(dist.scores, dim=-1)
    return dist.tokens((probs / noise).argmax(dim=-1))


def top_logprobs(
    dist: Distribution, tokens: torch.Tensor, width: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(each row's token's logprob [rows], the `width` largest logprobs [rows, width], their token ids)."""
    logprobs = torch.log_softmax(dist.scores, dim=-1)
    if dist.ids is None:
        own = logprobs.gather(1, tokens.unsqueeze(1)).squeeze(1)
    else:  # the token's column: a greedy or drawn token is always among its row's candidates
        own = logprobs.masked_fill(dist.ids != tokens.unsqueeze(1), NEG_INF).amax(dim=-1)
    if width == 0:
        empty = logprobs.new_empty((logprobs.shape[0], 0))
        return own, empty, empty.long()
    top = torch.topk(logprobs, width, dim=-1)
    return own, top.values, dist.tokens(top.indices)
