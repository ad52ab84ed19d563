"""Prefix digests are the engine's own tenant-scoped block keys; the per-engine memory is a bounded LRU."""

from __future__ import annotations

from engine.core.kv_cache import BlockPool, prefix_root
from engine.core.request import RequestMeta
from routing.affinity import DigestMemory, prefix_digests

BLOCK = 4


def pool_keys(tokens: list[int], meta: RequestMeta) -> list[bytes]:
    """The keys a BlockPool commits for these tokens under the request's root."""
    pool = BlockPool(64, BLOCK, True)
    assert pool.allocate("r", len(tokens))
    pool.commit_full_blocks(
        "r", tokens, len(tokens), prefix_root(meta.tenant_id, meta.cache_group, meta.cache_salt)
    )
    return pool.tables["r"].hashes


def test_digests_are_the_keys_the_engine_caches_blocks_under() -> None:
    tokens = list(range(1, 23))  # 5 full blocks and 2 tokens; the pool's last sampled position stays out
    meta = RequestMeta(tenant_id="a")
    assert prefix_digests(tokens, meta, BLOCK, 8) == pool_keys(tokens, meta)
    assert prefix_digests(tokens, meta, BLOCK, 2) == pool_keys(tokens, meta)[:2]
    assert (
        len(prefix_digests(list(range(8)), meta, BLOCK, 8)) == 1
    )  # 8 tokens: one block, the last token left over
    assert prefix_digests([1, 2], meta, BLOCK, 8) == []


def test_digests_are_scoped_by_tenant_group_and_salt() -> None:
    tokens = list(range(1, 30))
    a = prefix_digests(tokens, RequestMeta(tenant_id="a"), BLOCK, 4)
    assert not set(a) & set(prefix_digests(tokens, RequestMeta(tenant_id="b"), BLOCK, 4))
    grouped = [prefix_digests(tokens, RequestMeta(tenant_id=t, cache_group="acme"), BLOCK, 4) for t in "ab"]
    assert grouped[0] == grouped[1] and not set(grouped[0]) & set(a)
    salted = prefix_digests(tokens, RequestMeta(tenant_id="a", cache_salt="s"), BLOCK, 4)
    assert not set(salted) & set(a)


def test_memory_matches_the_deepest_remembered_prefix_and_forgets_the_oldest() -> None:
    meta = RequestMeta(tenant_id="a")
    shared = list(range(1, 13))
    one = prefix_digests(shared + [50, 51, 52, 53, 54], meta, BLOCK, 8)
    two = prefix_digests(shared + [60, 61, 62, 63, 64], meta, BLOCK, 8)
    memory = DigestMemory(capacity=6)
    memory.remember(one)
    assert memory.matched(one) == 4 and memory.matched(two) == 3  # the shared three blocks, not the fourth
    memory.remember(two)  # adds one new digest; the three shared ones are refreshed
    assert len(memory) == 5
    memory.remember(prefix_digests(list(range(100, 109)), meta, BLOCK, 8))  # two more: the oldest goes
    assert len(memory) == 6 and memory.matched(one) == 3 and memory.matched(two) == 4
    memory.clear()
    assert memory.matched(two) == 0


def test_public_blocks_are_left_out_so_a_registered_prompt_has_no_pull() -> None:
    """Two tenants sending the registered prompt with their own suffixes share no digest, and the digests
    start after the public blocks, chained as the engine chains them."""
    public = list(range(100, 112))  # three blocks
    tokens = public + list(range(1, 14))
    meta = RequestMeta(tenant_id="a", public_prefix_tokens=len(public))
    pool = BlockPool(64, BLOCK, True)
    assert pool.allocate("r", len(tokens))
    pool.commit_full_blocks("r", tokens, len(tokens), prefix_root("a"), public_blocks=3)
    assert prefix_digests(tokens, meta, BLOCK, 2) == pool.tables["r"].hashes[3:5]
    b = RequestMeta(tenant_id="b", public_prefix_tokens=len(public))
    assert not set(prefix_digests(public + [7] * 9, b, BLOCK, 8)) & set(
        prefix_digests(tokens, meta, BLOCK, 8)
    )
    assert prefix_digests(public + [9], b, BLOCK, 8) == []  # nothing after the prefix: no affinity at all
