"""Builds the fairness policy the scheduler consults, from the engine's FairnessConfig.

A policy that ranks by locality (`vtc-locality`, fairness/locality.py) gets `cached_blocks`: how many
leading prompt blocks of a request the pool holds right now. The policy layer knows no KV blocks, so
the engine hands it this probe; a request's keys are computed once and kept on it.
"""

from __future__ import annotations

from collections.abc import Callable

from engine.core.kv_cache import BlockPool, block_keys
from engine.core.request import Request
from engine.core.step_cost import StepCost
from fairness import FairnessConfig, make_policy
from fairness.base import SchedulingPolicy


def cached_blocks_probe(pool: BlockPool) -> Callable[[Request], int]:
    """`request -> leading prompt blocks cached in pool now` (0 with prefix caching off)."""

    def cached_blocks(request: Request) -> int:
        if not pool.enable_prefix_caching:
            return 0
        keys = request.prompt_block_keys
        if keys is None:
            size = pool.block_size
            blocks = (len(request.prompt_token_ids) - 1) // size
            keys = request.prompt_block_keys = block_keys(
                request.prompt_token_ids, blocks, size, request.prefix_root, request.public_blocks(size)
            )
        return pool.cached_blocks(keys)

    return cached_blocks


def build_policy(
    config: FairnessConfig, pool: BlockPool | None = None, step_cost: StepCost | None = None
) -> SchedulingPolicy[Request]:
    """The configured policy (a registered base, optionally under priority classes and EDF); `pool` feeds
    a locality-ranking policy's probe.

    `step_cost`: the step cost model whose work the scheduler charges, if it charges any. The lift
    allowance is set in plain tokens' service ("one 512-token answer"); with the sequence's constant on
    every sampled token an answer costs several times that, and an allowance left in plain units let a
    closed-loop weighted tenant keep only a fraction of an answer's credit between its requests: at 4:1,
    12 streams against 24, the split came out 1.5-1.7:1 (docs/fairness.md, "Lifting"). So it is scaled by
    what an answer token is charged (`StepCost.answer_token_scale`)."""
    if step_cost is not None and not step_cost.counts_tokens_only:
        scale = step_cost.answer_token_scale(config.w_in, config.w_out)
        config = config.model_copy(update={"lift_allowance": config.lift_allowance * scale})
    probe = cached_blocks_probe(pool) if pool is not None else None
    policy: SchedulingPolicy[Request] = make_policy(config, cached_blocks=probe)
    return policy
