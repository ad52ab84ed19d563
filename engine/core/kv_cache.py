"""The paged KV block pool: free list, per-request block tables, reference counts, prefix caching.

A block is cached once it is full: its key is a BLAKE2b digest chaining the parent block's key with
its token ids, so two requests share a block only when their whole prefix up to it is identical. The
chain starts from a root digest of the request's *cache salt* (`prefix_root`): the tenant by default,
an admin-set cache group when tenants should share, narrowed further by a per-request `cache_salt`.
So a tenant hits only blocks its own group computed, and `cached_tokens` or time to first token tell
it nothing about another tenant's prompts. The keys are cryptographic (not Python's `hash()`, which
is neither collision-resistant nor meant for adversarial input: vLLM's CVE-2025-25183). Memory stays
shared: isolation is in the keys, every block comes from one pool.

Public prefixes (gateway/public_prefixes.py): an operator may register a prompt prefix as public. The
blocks of a request that lie wholly inside its public prefix (`public_blocks`, set by the gateway, which
alone matches prompts against the registry) chain from `PUBLIC_ROOT` instead, so every tenant's request
that starts with the prefix shares them; the first block after them chains from a digest of the
request's own root *and* the last public key (`private_parent`), so everything after the prefix stays
keyed by tenant, cache group and salt exactly as before. A request with no public prefix keys as it
always did.

A freed cached block goes to the tail of the free list with its key kept, and is reused by a later
hit until it is evicted from the head for a fresh allocation (LRU).
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class Block:
    """One physical KV block."""

    block_id: int
    ref_count: int = 0
    block_hash: bytes | None = None


@dataclass
class BlockTable:
    """A request's logical-to-physical block list plus the hashes of its full blocks."""

    block_ids: list[int] = field(default_factory=list)
    hashes: list[bytes] = field(default_factory=list)


_DIGEST = 32  # bytes of BLAKE2b output: 256 bits, collision-resistant
DEFAULT_ROOT = hashlib.blake2b(b"fairserve-prefix-v1", digest_size=_DIGEST).digest()


def prefix_root(
    tenant_id: str,
    cache_group: str | None = None,
    cache_salt: str | None = None,
    lora: str | None = None,
    lora_path: str | None = None,
) -> bytes:
    """The digest every block key of a request chains from: its cache group (the tenant unless an admin
    named a group), its optional per-request salt and its LoRA adapter, if any (an adapter's K and V
    differ from the base model's), by name and, when the gateway gave one, directory (one name may be
    registered again over another directory). Length-prefixed parts, so no two inputs collide; without an
    adapter the digest is what it was before adapters existed."""
    group = f"group:{cache_group}" if cache_group else f"tenant:{tenant_id}"
    h = hashlib.blake2b(b"fairserve-prefix-v1", digest_size=_DIGEST)
    parts: tuple[str, ...] = (group, cache_salt or "")
    if lora is not None:
        parts += (f"lora:{lora}",) if lora_path is None else (f"lora:{lora}", f"lora_path:{lora_path}")
    for part in parts:
        raw = part.encode("utf-8", "surrogatepass")
        h.update(len(raw).to_bytes(8, "little"))
        h.update(raw)
    return h.digest()


PUBLIC_ROOT = hashlib.blake2b(b"fairserve-prefix-v1:public", digest_size=_DIGEST).digest()


def private_parent(root: bytes, last_public: bytes) -> bytes:
    """The parent of a request's first block after its public prefix: its own root bound to the public
    chain, so a private block is shared only within the root's group and only after the same prefix."""
    return hashlib.blake2b(root + last_public, digest_size=_DIGEST).digest()


def first_parent(root: bytes, public_blocks: int) -> bytes:
    """Where block 0's key chains from: the public root when the request starts with public blocks."""
    return PUBLIC_ROOT if public_blocks > 0 else root


def chain_hash(parent: bytes, tokens: Sequence[int]) -> bytes:
    """Key of a full block: BLAKE2b over its parent's key and its token ids, so equal keys mean equal prefixes
    under the same root."""
    return hashlib.blake2b(parent + array("q", tokens).tobytes(), digest_size=_DIGEST).digest()


def block_keys(
    token_ids: Sequence[int], blocks: int, block_size: int, root: bytes, public_blocks: int
) -> list[bytes]:
    """Keys of the first `blocks` full blocks of `token_ids`, chained as `match_prefix` chains them."""
    keys: list[bytes] = []
    parent = first_parent(root, public_blocks)
    for i in range(blocks):
        if i == public_blocks and i:
            parent = private_parent(root, parent)
        parent = chain_hash(parent, token_ids[i * block_size : (i + 1) * block_size])
        keys.append(parent)
    return keys


class NoFreeBlock(Exception):
    """`copy_on_write` found no free block for the copy."""


class BlockPool:
    """Fixed pool of `num_blocks` blocks of `block_size` token slots."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Insertion order is eviction order: fresh frees go to the tail.
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self._cached: dict[bytes, int] = {}  # block key -> block id
        self.tables: dict[str, BlockTable] = {}
        self.alloc_failures = 0

    # -- accounting -------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        """Blocks that can be handed out now (including evictable cached ones)."""
        return len(self._free)

    @property
    def num_used(self) -> int:
        """Blocks referenced by at least one request."""
        return self.num_blocks - len(self._free)

    def blocks_needed(self, request_id: str, num_tokens: int) -> int:
        """How many more blocks `request_id` needs to hold `num_tokens` tokens."""
        have = len(self.tables[request_id].block_ids) if request_id in self.tables else 0
        return max(0, -(-num_tokens // self.block_size) - have)

    # -- prefix cache -----------------------------------------------------------------------
    def match_prefix(
        self, token_ids: Sequence[int], root: bytes = DEFAULT_ROOT, public_blocks: int = 0
    ) -> tuple[list[int], list[bytes]]:
        """Longest run of cached full blocks at the start of `token_ids` under `root` (the first
        `public_blocks` under `PUBLIC_ROOT`): (block ids, keys).

        At least one token is always left uncached so the request has a position to sample from.
        """
        if not self.enable_prefix_caching:
            return [], []
        ids: list[int] = []
        hashes: list[bytes] = []
        parent = first_parent(root, public_blocks)
        max_blocks = (len(token_ids) - 1) // self.block_size
        for i in range(max_blocks):
            if i == public_blocks and i:
                parent = private_parent(root, parent)
            h = chain_hash(parent, token_ids[i * self.block_size : (i + 1) * self.block_size])
            block_id = self._cached.get(h)
            if block_id is None:
                break
            ids.append(block_id)
            hashes.append(h)
            parent = h
        return ids, hashes

    def cached_blocks(self, keys: Sequence[bytes]) -> int:
        """How many of a request's leading block keys (as `match_prefix` chains them) are cached now."""
        cached = self._cached
        for i, key in enumerate(keys):
            if key not in cached:
                return i
        return len(keys)

    def attach_prefix(self, request_id: str, block_ids: list[int], hashes: list[bytes]) -> None:
        """Give a new request the matched cached blocks (reference counted, pulled off the free list)."""
        table = self.tables.setdefault(request_id, BlockTable())
        assert not table.block_ids, "prefix attaches only to an empty table"
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self._free[block_id]
            block.ref_count += 1
        table.block_ids.extend(block_ids)
        table.hashes.extend(hashes)

    # -- allocation -------------------------------------------------------------------------
    def allocate(self, request_id: str, num_tokens: int) -> bool:
        """Grow `request_id`'s table to hold `num_tokens` tokens; False (nothing changed) if short of blocks."""
        need = self.blocks_needed(request_id, num_tokens)
        if need > len(self._free):
            self.alloc_failures += 1
            return False
        table = self.tables.setdefault(request_id, BlockTable())
        for _ in range(need):
            block_id, _ = self._free.popitem(last=False)
            block = self.blocks[block_id]
            if block.block_hash is not None:
                # Evicting a cached block: forget its hash unless another copy took the slot.
                if self._cached.get(block.block_hash) == block_id:
                    del self._cached[block.block_hash]
                block.block_hash = None
            block.ref_count = 1
            table.block_ids.append(block_id)
        return True

    def copy_on_write(self, request_id: str, position: int) -> tuple[int, int] | None:
        """Before `request_id` writes the token at `position`: if the block holding it is shared (the prompt's
        partial last block, which the choices of n > 1 fork by reference, engine/core/family.py), give the
        request a fresh block in its place and return (shared, fresh) for the caller to copy; None when
        the block is its own or not yet allocated. Raises NoFreeBlock (nothing changed) when the pool has no
        block to give."""
        table = self.tables.get(request_id)
        index = position // self.block_size
        if table is None or index >= len(table.block_ids):
            return None
        shared = self.blocks[table.block_ids[index]]
        if shared.ref_count == 1:
            return None
        if not self._free:
            self.alloc_failures += 1
            raise NoFreeBlock(request_id)
        fresh_id, _ = self._free.popitem(last=False)
        fresh = self.blocks[fresh_id]
        if fresh.block_hash is not None:  # evicting a cached block, as `allocate` does
            if self._cached.get(fresh.block_hash) == fresh_id:
                del self._cached[fresh.block_hash]
            fresh.block_hash = None
        fresh.ref_count = 1
        shared.ref_count -= 1
        table.block_ids[index] = fresh_id
        del table.hashes[index:]  # a partial block has no hash; the fresh one gets its own when full
        return shared.block_id, fresh_id

    def commit_full_blocks(
        self,
        request_id: str,
        token_ids: Sequence[int],
        num_computed: int,
        root: bytes = DEFAULT_ROOT,
        public_blocks: int = 0,
    ) -> None:
        """Register the keys of blocks that became full and computed (chained from `root`, the request's
        prefix_root, after its first `public_blocks` public ones), so later requests can share them."""
        if not self.enable_prefix_caching:
            return
        table = self.tables.get(request_id)
        if table is None:
            return
        full = min(num_computed // self.block_size, len(table.block_ids))
        parent = table.hashes[-1] if table.hashes else first_parent(root, public_blocks)
        for i in range(len(table.hashes), full):
            if i == public_blocks and i:
                parent = private_parent(root, parent)
            h = chain_hash(parent, token_ids[i * self.block_size : (i + 1) * self.block_size])
            table.hashes.append(h)
            parent = h
            block = self.blocks[table.block_ids[i]]
            if block.block_hash is None and h not in self._cached:
                block.block_hash = h
                self._cached[h] = block.block_id

    def free(self, request_id: str) -> int:
        """Release every block of `request_id`; returns how many it held."""
        table = self.tables.pop(request_id, None)
        if table is None:
            return 0
        # Free in reverse so a request's tail blocks are evicted before its (more shareable) head.
        for block_id in reversed(table.block_ids):
            block = self.blocks[block_id]
            block.ref_count -= 1
            assert block.ref_count >= 0, f"block {block_id} freed twice"
            if block.ref_count == 0:
                self._free[block_id] = None
        return len(table.block_ids)

    def block_ids(self, request_id: str) -> list[int]:
        """The request's physical blocks in logical order."""
        table = self.tables.get(request_id)
        return table.block_ids if table else []

    def check_invariants(self) -> None:
        """Assert the pool is consistent: reference counts match tables, free list holds exactly the unreferenced."""
        counts = [0] * self.num_blocks
        for table in self.tables.values():
            for block_id in table.block_ids:
                counts[block_id] += 1
        for block in self.blocks:
            assert block.ref_count == counts[block.block_id], f"block {block.block_id} refcount mismatch"
            assert (block.ref_count == 0) == (block.block_id in self._free), (
                f"block {block.block_id} free-list mismatch"
            )
