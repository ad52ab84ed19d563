"""Builds the fairness policy the scheduler consults, from the engine's FairnessConfig.

A policy that ranks by locality (`vtc-locality`, fairness/locality.py) gets `cached_blocks`: how many
leading prompt blocks of a request the pool holds right now. The policy layer knows no KV blocks, so
the engine hands it this probe; a request's keys are computed once and kept on it.
"""

from __future__ import annotations

from collections.abc import Callable

from engine.kv_cache import BlockPool, block_keys
from engine.request import Request
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


def build_policy(config: FairnessConfig, pool: BlockPool | None = None) -> SchedulingPolicy[Request]:
    """The configured policy (a registered base, optionally under priority classes and EDF); `pool` feeds
    a locality-ranking policy's probe."""
    probe = cached_blocks_probe(pool) if pool is not None else None
    policy: SchedulingPolicy[Request] = make_policy(config, cached_blocks=probe)
    return policy
