"""The block pool: allocation, freeing, reference counts and prefix caching."""

from __future__ import annotations

from engine.core.kv_cache import BlockPool


def test_allocate_grows_table_and_refuses_without_side_effects() -> None:
    pool = BlockPool(num_blocks=4, block_size=4, enable_prefix_caching=True)
    assert pool.allocate("a", 9)  # 3 blocks
    assert len(pool.block_ids("a")) == 3
    assert not pool.allocate("b", 8)  # needs 2, one free
    assert pool.block_ids("b") == []
    assert pool.num_free == 1
    assert pool.alloc_failures == 1
    pool.check_invariants()


def test_free_returns_every_block() -> None:
    pool = BlockPool(num_blocks=8, block_size=4, enable_prefix_caching=True)
    pool.allocate("a", 10)
    pool.allocate("b", 5)
    assert pool.free("a") == 3
    assert pool.free("b") == 2
    assert pool.num_free == 8
    pool.check_invariants()


def test_prefix_hit_shares_full_blocks_and_leaves_one_token() -> None:
    pool = BlockPool(num_blocks=16, block_size=4, enable_prefix_caching=True)
    prompt = list(range(10))
    pool.allocate("a", len(prompt))
    pool.commit_full_blocks("a", prompt, len(prompt))
    ids, hashes = pool.match_prefix(prompt + [99, 98])
    assert ids == pool.block_ids("a")[:2]  # 8 of 10 computed tokens sit in full blocks
    pool.attach_prefix("b", ids, hashes)
    assert all(pool.blocks[i].ref_count == 2 for i in ids)
    # A prompt that is exactly two full blocks reuses only the first: one token must stay to sample from.
    ids2, _ = pool.match_prefix(prompt[:8])
    assert len(ids2) == 1
    pool.check_invariants()


def test_different_prefix_does_not_hit() -> None:
    pool = BlockPool(num_blocks=16, block_size=4, enable_prefix_caching=True)
    prompt = list(range(12))
    pool.allocate("a", 12)
    pool.commit_full_blocks("a", prompt, 12)
    other = [100] + prompt[1:]
    assert pool.match_prefix(other) == ([], [])


def test_freed_cached_block_survives_until_evicted() -> None:
    pool = BlockPool(num_blocks=3, block_size=4, enable_prefix_caching=True)
    prompt = list(range(9))
    pool.allocate("a", 9)
    pool.commit_full_blocks("a", prompt, 9)
    pool.free("a")
    assert len(pool.match_prefix(prompt)[0]) == 2
    # Allocating every block evicts the cached ones: their hashes must be forgotten.
    assert pool.allocate("b", 12)
    assert pool.match_prefix(prompt) == ([], [])
    pool.check_invariants()


def test_prefix_caching_can_be_disabled() -> None:
    pool = BlockPool(num_blocks=8, block_size=4, enable_prefix_caching=False)
    prompt = list(range(9))
    pool.allocate("a", 9)
    pool.commit_full_blocks("a", prompt, 9)
    assert pool.match_prefix(prompt) == ([], [])
