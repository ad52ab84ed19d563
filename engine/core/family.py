"""Several choices of one request (SamplingParams.n > 1): a `Family` of requests that share one prefill.

The leader (choice 0, under the request's own id) is queued and prefilled like any request. In the step
whose forward computes its last prompt token (`fork_at`, the prompt's length), the scheduler forks the
followers (engine/core/scheduler_state.py `_fork_sampled`): each takes every one of the leader's prompt blocks by
reference count (`share_prompt`), computes no prompt token, and samples its first token, with its own seed,
from the leader's last prompt row of that step, which the runner repeats for it. The partially filled last
block is shared too: the first member to write into it (its first decode) gets a fresh block and a copy of
the shared one (copy on write, engine/core/kv_cache.py `copy_on_write`, copied on the device before that step's
forward), until the last holder writes in place. The prompt is charged once, by the leader; each choice
is charged its own decodes (docs/fairness.md, "Several choices"; docs/engine.md, "Several choices").

With sliding-window layers outside the pool (engine/worker/window_cache.py) there is no prompt KV to share:
`fork_at` is 0, the followers fork at the leader's admission and each computes the prompt itself.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import replace

from engine.core.kv_cache import BlockPool

# Family, the data, is defined beside Request (each refers to the other); re-exported here with the
# operations on it, so request.py needs nothing of this module (import contract in pyproject.toml).
from engine.core.request import Family as Family
from engine.core.request import FinishReason, Request, RequestMeta, RequestState, SamplingParams


def choice_id(request_id: str, index: int) -> str:
    """The engine-internal id of a request's choice `index` (choice 0 keeps the request's own id)."""
    return request_id if index == 0 else f"{request_id}#{index}"


def choice_seed(seed: int | None, index: int) -> int | None:
    """Choice `index`'s seed: the request's own for choice 0 (so n=1 and choice 0 agree), a digest of it
    and the index for the others, so seeded choices differ from each other yet repeat run to run."""
    if seed is None or index == 0:
        return seed
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def make_family(
    request_id: str, prompt: list[int], params: SamplingParams, meta: RequestMeta, fork_at: int
) -> Family:
    """The n requests of `params.n` choices, each with one choice's parameters (its seed), all pending
    but the leader."""
    members = [
        Request(
            choice_id(request_id, i), prompt, replace(params, n=1, seed=choice_seed(params.seed, i)), meta
        )
        for i in range(params.n)
    ]
    family = Family(request_id, members, fork_at, pending=members[1:])
    for i, member in enumerate(members):
        member.family, member.choice_index = family, i
    return family


def share_prompt(pool: BlockPool, family: Family, followers: list[Request]) -> None:
    """Give each follower the leader's blocks holding its first `fork_at` tokens (one reference each, the
    partial last one included: it is copied when first written, engine/core/kv_cache.py `copy_on_write`) and
    start it there; the prompt was charged to the leader, so a follower's prompt is free."""
    leader = family.leader
    shared = -(-family.fork_at // pool.block_size)
    block_ids = pool.block_ids(leader.request_id)[:shared]
    table = pool.tables.get(leader.request_id)
    hashes = table.hashes[:shared] if table is not None else []  # the full blocks committed so far
    for follower in followers:
        pool.attach_prefix(follower.request_id, block_ids, hashes)
        follower.num_computed_tokens = family.fork_at
        follower.num_charged_prompt_tokens = follower.num_prompt_tokens
        follower.first_scheduled_time = leader.first_scheduled_time
        follower.state = RequestState.RUNNING


def end_unforked(family: Family, reason: FinishReason, now: float) -> None:
    """The leader ended before the fork: its pending choices end with it, having computed nothing."""
    followers, family.pending = family.pending, []
    for follower in followers:
        follower.state = RequestState.FINISHED
        follower.finish_reason = reason
        follower.finished_time = now


def with_families(touched: Iterable[Request]) -> Iterable[Request]:
    """`touched` by id, with every choice of a touched family: a leader that ends before its fork ends its
    pending choices, which were never scheduled themselves."""
    by_id = {r.request_id: r for r in touched}
    families = {id(r.family): r.family for r in by_id.values() if r.family is not None}
    for family in families.values():
        for member in family.members:
            by_id.setdefault(member.request_id, member)
    return by_id.values()
