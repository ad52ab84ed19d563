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

Every decision that differs for a request of n > 1 choices is made here, and the scheduler and the engine
ask by name: the seats and blocks an unforked leader reserves (`unforked`, `unforked_blocks`), when the
fork happens (`forks_at_admission`, `forks_after_chunk`; a decode's copy-on-write check, inlined in the scheduler's decode loop), which choices a request stands for
(`choices_of`), what ends with a leader (`end_choice`) and when a request's last output goes out
(`closes_request`). What stays outside is mechanism: the fork's seat and deadline bookkeeping
(engine/core/scheduler_state.py `_fork`), the forked rows the runner repeats (engine/worker/model_runner.py),
and a choice's output carrying its family's id (engine/core/outputs.py). Kept in the core rather than fanned
out above it: measured in experiments/n_choices.py (docs/engine.md, "Several choices").
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import replace

from engine.core.kv_cache import BlockPool

# Family, the data, is defined beside Request (each refers to the other); re-exported here with the
# operations on it, so request.py needs nothing of this module (import contract in pyproject.toml).
from engine.core.request import Family as Family
from engine.core.request import FinishReason, Request, RequestMeta, RequestState
from engine.core.sampling_params import SamplingParams


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


def choices_of(request: Request) -> list[Request]:
    """The requests `request` stands for: every choice of its family, or itself."""
    return request.family.members if request.family is not None else [request]


def unforked(request: Request) -> int:
    """Choices still to fork from `request` (a leader before its fork): a seat each, reserved while it runs."""
    family = request.family
    return len(family.pending) if family is not None and request.choice_index == 0 else 0


def unforked_blocks(request: Request, block_size: int) -> int:
    """Blocks the unforked choices of a leader being admitted need of their own: the partial last prompt
    block each (copied when first written; none when the prompt fills its blocks), or the whole prompt
    with sliding-window layers (`fork_at` 0)."""
    family = request.family
    if family is None or not family.pending:
        return 0
    prompt_blocks = -(-request.num_prompt_tokens // block_size)
    return len(family.pending) * (prompt_blocks - family.fork_at // block_size)


def forks_at_admission(request: Request, cached: int) -> Family | None:
    """The family to fork as its leader is admitted: its prompt KV up to `fork_at` is cached already (or
    `fork_at` is 0). None otherwise."""
    family = request.family
    return family if family is not None and family.pending and cached >= family.fork_at else None


def forks_after_chunk(request: Request, end: int) -> Family | None:
    """The family to fork in this step: its leader's chunk ending at `end` completes the prompt, so each
    choice samples its first token from that row. None otherwise."""
    family = request.family
    if family is None or not family.pending or not family.fork_at:
        return None
    return family if end == family.fork_at else None


def end_choice(request: Request, now: float) -> bool:
    """`request` just ended: a leader ending before its fork ends its unforked choices with it. True when
    every choice of its family has ended (the family is done)."""
    family = request.family
    if family is None:
        return False
    if family.pending:
        assert request.finish_reason is not None
        end_unforked(family, request.finish_reason, now)
    return all(m.is_finished for m in family.members)


def closes_request(request: Request) -> bool:
    """Whether this output of `request` is its request's last: its own end, or for a choice of n > 1 the
    last choice's end (counted here, once per choice)."""
    family = request.family
    if family is None or not request.is_finished:
        return request.is_finished
    family.ended += 1
    return family.ended == len(family.members)
