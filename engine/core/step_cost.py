"""One model of what a step costs, used by both the step's budget and the fair-share charge (issue 54).

A chunk of `length` new tokens of one sequence, starting at position `start` (the positions before it are
in the KV cache), takes, in new-token equivalents,

    cost = length + context · (length · start + length · (length − 1) / 2) + sequence

- `length`: the projections and MLP every new token runs (the unit: one new token at no context);
- `context` per position attended: each new token at position p attends over the p positions before it
  (QKᵀ and ·V), the cached context and the chunk's own earlier tokens, so a chunk attends over
  `length · start + length · (length − 1) / 2` positions; summed over a prompt's chunks that is the same
  however the prompt was split;
- `sequence`: what every sequence in a step costs whatever its length (its rows in the batch's metadata, its
  sampling, its output); a decode is one new token, its context and this constant.

The step budget is the cost of the reference step, one sequence of `max_num_batched_tokens` new tokens at
no context: `max_num_batched_tokens + sequence`. Before this model the budget and the charge counted new
tokens only, so 48 requests each re-sending its own cached 2,047-token prompt (15 new tokens each) filled a
step that looked like 720 tokens and took many times a 512-token step (docs/fairness.md, "The step's cost").

The coefficients come from `StepCostConfig` (engine/config.py): `context` from the model's shape (attention
FLOPs per cached position over the linear FLOPs of a token, engine/worker/lora/cost.py) times a per-device-kind
factor for how much slower attention runs per FLOP than the projections; `sequence` per device kind. Both
can be set by flag; `python -m experiments.step_cost` measures them on the running hardware.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class StepCost:
    """`length · (1 + context · start) + sequence` new-token equivalents for a chunk (see the module)."""

    context: float = 0.0
    sequence: float = 0.0

    def __post_init__(self) -> None:
        for name in ("context", "sequence"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"step cost {name} must be a finite number >= 0, got {value!r}")

    @property
    def counts_tokens_only(self) -> bool:
        """True for the plain token count (both coefficients 0): a step's cost is its new tokens."""
        return self.context == 0 and self.sequence == 0

    def budget(self, max_num_batched_tokens: int) -> float:
        """The step budget: the reference step's cost, one sequence of `max_num_batched_tokens` new tokens
        from position 0."""
        return self.chunk(0, max_num_batched_tokens)

    def attended(self, start: int, length: int) -> float:
        """Positions the `length` new tokens from `start` attend over, in cost units (`context` each)."""
        return self.context * (length * start + length * (length - 1) / 2)

    def chunk(self, start: int, length: int) -> float:
        """Cost of one sequence's `length` new tokens from position `start`."""
        return length + self.attended(start, length) + self.sequence

    def work(self, start: int, length: int, samples: bool) -> float:
        """What is charged beyond the new tokens, as prefill at `w_in`: the positions attended, and the
        sequence's constant once per sampled token (a decode, a prompt's last chunk). Both are the same
        however a prompt is chunked, so a request's bill does not depend on how the steps happened to
        fall (docs/fairness.md, "The step's cost")."""
        return self.attended(start, length) + (self.sequence if samples else 0.0)

    def answer_token_scale(self, w_in: float, w_out: float) -> float:
        """How many times its plain charge (`w_out`) an answer token is charged with the step's work: the
        sequence's constant rides on every sampled token, at `w_in` (`work`). Service amounts set in plain
        tokens, such as VTC's lift allowance ("one 512-token answer"), are scaled by it so that they keep
        meaning what they say (engine/core/policy.py); the context term, which grows with the answer, is left
        out: it is small beside the constant on every device kind measured."""
        return 1.0 if w_out <= 0 else (w_out + w_in * self.sequence) / w_out

    def fit(self, start: int, budget: float, most: int) -> int:
        """The most new tokens (at most `most`) from position `start` whose chunk costs ≤ `budget`."""
        room = budget - self.sequence
        if room < 1 or most <= 0:
            return 0
        # a·length² + b·length ≤ room, a = context/2, b = 1 + context·(start − 1/2): the positive root, in
        # the form that does not cancel when a is tiny (2c / (b + √(b² + 4ac)) rather than (−b + √…) / 2a).
        a, b = self.context / 2, 1.0 + self.context * (start - 0.5)
        root = 2 * room / (b + math.sqrt(b * b + 4 * a * room))
        length = max(0, min(most, math.floor(root)))
        # The float root may be off by one either way.
        while length and self.chunk(start, length) > budget:
            length -= 1
        while length < most and self.chunk(start, length + 1) <= budget:
            length += 1
        return length


TOKENS_ONLY = StepCost()


# Per device kind: (attention's cost per FLOP over the projections', a sequence's constant in new tokens).
# cpu: measured with `python -m experiments.step_cost` on the embedded model (factor 4.1, sequence 11.5 on
# a loaded 2-core machine, 2026-12-07; rounded). cuda: not yet measured, the FLOP ratio as is and one token
# per sequence; run the experiment on the device kind and set the flags, or change the row
# (docs/engine.md, "The step's cost").
DEVICE_DEFAULTS: dict[str, tuple[float, float]] = {"cpu": (4.0, 12.0), "cuda": (1.0, 1.0)}


def resolve(device: str, flop_ratio: float, context: float | None, sequence: float | None) -> StepCost:
    """The engine's step cost: the configured coefficients, else the device kind's defaults (`flop_ratio`: the
    model's attention FLOPs per cached position over its linear FLOPs per token, engine/worker/lora/cost.py
    `attention_flop_ratio`)."""
    factor, default_sequence = DEVICE_DEFAULTS.get(device.partition(":")[0], DEVICE_DEFAULTS["cuda"])
    return StepCost(
        context=factor * flop_ratio if context is None else context,
        sequence=default_sequence if sequence is None else sequence,
    )
