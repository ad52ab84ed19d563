"""Prefix affinity: the tenant-scoped digests of a prompt's first blocks, and what each engine was sent.

The digests are the engine's own prefix-cache keys (engine/core/kv_cache.py: `prefix_root` of the tenant,
cache group and salt, then `chain_hash` per full block; a public prefix's blocks are skipped), so a
digest the router remembers for an engine names blocks that engine computed, and two tenants with the same prompt never share one: tenant
B is not pulled toward the engine that holds tenant A's blocks, and routing reveals nothing of A's
prompts to B. The router cannot see an engine's cache, only what it sent there; an evicted block is a
missed hint, which costs a prefill and nothing else.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from engine.core.kv_cache import block_keys, prefix_root
from engine.core.request import RequestMeta


def prefix_digests(
    prompt_token_ids: Sequence[int], meta: RequestMeta, block_size: int, blocks: int
) -> list[bytes]:
    """Keys of the prompt's first `blocks` full blocks after its public ones, as an engine with
    `block_size` caches them.

    Like `BlockPool.match_prefix`, a prompt's last token is never part of a cached block, so a prompt of
    exactly n blocks contributes n - 1. Blocks of a public prefix (gateway/public_prefixes.py) are left
    out: every tenant's requests share them, so they would pin a registered prompt's whole traffic to
    the engine that first computed it; any engine computes them once and keeps them hot. A registered
    prompt is thus spread by load, and affinity follows only what comes after it.
    """
    public = max(0, min(meta.public_prefix_tokens, len(prompt_token_ids))) // block_size
    if meta.lora is not None:  # an adapter's blocks are never keyed publicly (engine/core/request.py)
        public = 0
    full = min((len(prompt_token_ids) - 1) // block_size, public + blocks)
    root = prefix_root(meta.tenant_id, meta.cache_group, meta.cache_salt, meta.lora, meta.lora_path)
    return block_keys(prompt_token_ids, max(full, 0), block_size, root, public)[public:]


class DigestMemory:
    """A bounded LRU of the block digests routed to one engine.

    Hand-written over an OrderedDict: the whole need is "insert or refresh, evict the oldest", one dict
    operation each, on the request path.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._keys: OrderedDict[bytes, None] = OrderedDict()

    def matched(self, digests: Sequence[bytes]) -> int:
        """How many leading blocks of a prompt this engine was sent before.

        Each digest chains over all blocks before it, so the deepest remembered one vouches for the whole
        prefix up to it.
        """
        for depth in range(len(digests), 0, -1):
            if digests[depth - 1] in self._keys:
                return depth
        return 0

    def remember(self, digests: Sequence[bytes]) -> None:
        """Record a routed prompt's digests as the most recent."""
        keys = self._keys
        for digest in digests:
            keys[digest] = None
            keys.move_to_end(digest)
        while len(keys) > self.capacity:
            keys.popitem(last=False)

    def clear(self) -> None:
        """Forget everything: the engine restarted with an empty cache."""
        self._keys.clear()

    def __len__(self) -> int:
        return len(self._keys)
