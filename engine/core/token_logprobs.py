"""One sampled token's log probability and its most likely alternatives: what `SamplingParams.logprobs` asks for.

A module of its own: the sampler makes them, the request keeps them, outputs carry them across the engine
boundary (an array-like msgspec Struct, like the other per-token frames there).
"""

from __future__ import annotations

import msgspec


class TokenLogprobs(msgspec.Struct, array_like=True, gc=False):
    """One sampled token's log probability and the most likely tokens beside it (`SamplingParams.logprobs`).

    The values are of the distribution the token was drawn from: after logit bias, temperature, top-k and
    top-p, -inf for a token those excluded (engine/worker/sampler.py). The token itself is the output's id.
    """

    logprob: float
    top_ids: list[int]  # most likely first, `SamplingParams.logprobs` of them
    top_logprobs: list[float]
