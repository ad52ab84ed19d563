"""Public prefixes at the scheduler: blocks wholly inside a registered prefix are shared by every tenant,
every block after it stays keyed by tenant, cache group and salt (the gateway's match:
tests/gateway/test_public_prefixes.py)."""

from __future__ import annotations

from engine.core.kv_cache import BlockPool
from engine.core.request import Request, RequestMeta
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import Scheduler
from tests.defaults import fcfs, scheduler_config
from tests.engine.core.test_scheduler import run_step

BLOCK = 4
SYSTEM = list(range(100, 114))  # 14 tokens: three whole blocks (12) are public, the 4th straddles


def _scheduler() -> Scheduler:
    cfg = scheduler_config(max_num_batched_tokens=256, max_num_seqs=8, max_model_len=4096)
    return Scheduler(cfg, BlockPool(64, BLOCK, True), fcfs())


def _serve(
    s: Scheduler, rid: str, tenant: str, suffix: list[int], public: int, cache_salt: str | None = None
) -> Request:
    meta = RequestMeta(tenant_id=tenant, public_prefix_tokens=public, cache_salt=cache_salt)
    request = Request(rid, SYSTEM + suffix, SamplingParams(max_tokens=1), meta)
    s.add(request)
    while not request.is_finished:
        run_step(s)
    return request


def test_public_blocks_are_shared_across_tenants_and_private_ones_are_not() -> None:
    s = _scheduler()
    suffix = [7, 8, 9, 10, 11, 12, 13, 14, 15]
    _serve(s, "a", "alice", suffix, len(SYSTEM))
    bob = _serve(s, "b", "bob", suffix, len(SYSTEM))
    assert (bob.num_cached_tokens, bob.num_public_cached_tokens) == (12, 12)  # the public part only
    again = _serve(s, "c", "alice", suffix, len(SYSTEM))
    assert again.num_cached_tokens == 20 and again.num_public_cached_tokens == 12  # + her own blocks
    salted = _serve(s, "d", "alice", suffix, len(SYSTEM), cache_salt="job")
    assert (salted.num_cached_tokens, salted.num_public_cached_tokens) == (12, 12)
    s.pool.check_invariants()


def test_without_the_public_mark_nothing_is_shared_and_keys_are_unchanged() -> None:
    s = _scheduler()
    _serve(s, "a", "alice", [1, 2, 3], len(SYSTEM))
    assert _serve(s, "b", "bob", [1, 2, 3], 0).num_cached_tokens == 0  # public keys differ from bob's own
    # A private request keys exactly as before public prefixes existed: the owner's repeat hits.
    _serve(s, "c", "carol", [5, 6, 7], 0)
    assert _serve(s, "d", "carol", [5, 6, 7], 0).num_cached_tokens == 16


def test_a_private_suffix_is_not_reachable_through_the_public_chain() -> None:
    """Bob sends alice's exact prompt with the public mark: he gets the public blocks, never her suffix."""
    s = _scheduler()
    secret = [31, 32, 33, 34, 35, 36, 37, 38, 39]
    _serve(s, "a", "alice", secret, len(SYSTEM))
    bob = _serve(s, "b", "bob", secret, len(SYSTEM))
    assert bob.num_cached_tokens == bob.num_public_cached_tokens == 12
