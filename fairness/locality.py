"""VTC with prefix locality (`--policy vtc-locality`): among the backlogged keys whose counters lie within
a slack Δ of the minimum, admit the head request with the most cached prefix blocks.

Plain VTC admits the least-served key's head whatever it costs to prefill; when few prompt families are
shared by many tenants (public prefixes, or one cache group) and the KV cache holds only some of them,
that order evicts a family's blocks just before the next request of it arrives. Here the scheduler's
choice is widened to the keys within Δ of the minimum counter and narrowed again by locality: the head
with the most leading blocks cached now (`cached_blocks`, a probe the engine gives: the policy itself
knows nothing of KV blocks). Ties go to the smaller counter, then to the earlier backlogged key, so with
Δ = 0 or nothing cached this is exactly VTC.

The bound. A key is only ever served while its counter is at most Δ above the least backlogged one
(VTC serves it only at the minimum). So over any interval in which two keys are backlogged their
weighted service differs by at most VTC's bound plus Δ: `2·max(w_in·L_in, w_out·M) + Δ` (+ the lift
allowance for a key that just returned, as for VTC). Δ is in service units (`w_in` per prompt token),
`FairnessConfig.locality_slack`. Checked in the simulator (tests/sim/test_locality.py).

Cost: `peek` looks at every backlogged key (O(K) for K backlogged keys, and one probe per key within Δ)
instead of VTC's O(log K) heap top.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic

from fairness.base import T
from fairness.cost import TokenCost
from fairness.keys import KeyFn, tenant_key
from fairness.vtc import VTCPolicy

CachedBlocks = Callable[[Any], int]


def _none_cached(item: Any) -> int:
    return 0


class LocalityVTCPolicy(VTCPolicy[T], Generic[T]):
    """VTC whose admission prefers, within Δ of the least-served key, the head with most cached blocks."""

    def __init__(
        self,
        cost: TokenCost,
        key_fn: KeyFn = tenant_key,
        *,
        lift_allowance: float,
        locality_slack: float,
        cached_blocks: CachedBlocks | None,
    ) -> None:
        super().__init__(cost, key_fn, lift_allowance=lift_allowance)
        if not locality_slack >= 0 or locality_slack == float("inf"):
            raise ValueError(f"locality_slack must be a finite number >= 0, got {locality_slack!r}")
        self.locality_slack = locality_slack
        self.cached_blocks: CachedBlocks = cached_blocks or _none_cached

    def peek(self, now: float) -> T | None:
        """The head with the most cached blocks among keys within Δ of the least counter."""
        least = self._min_key()
        if least is None:
            return None
        head = self._queues[least].head()
        if self.locality_slack == 0:
            return head
        counters, seqs = self._counters, self._backlog_seq
        ceiling = counters[least] + self.locality_slack
        best, best_rank = head, (-self.cached_blocks(head), counters[least], seqs[least])
        for key, queue in self._queues.items():
            counter = counters[key]
            if key == least or counter > ceiling:
                continue
            item = queue.head()
            if item is None:
                continue
            rank = (-self.cached_blocks(item), counter, seqs[key])
            if rank < best_rank:
                best, best_rank = item, rank
        return best


def build_locality_vtc(
    cost: TokenCost,
    key_fn: KeyFn,
    *,
    lift_allowance: float,
    locality_slack: float,
    cached_blocks: CachedBlocks | None = None,
) -> LocalityVTCPolicy[Any]:
    """The registry's "vtc-locality" (flat over the fairness key; two-level keys are refused by config)."""
    return LocalityVTCPolicy(
        cost,
        key_fn,
        lift_allowance=lift_allowance,
        locality_slack=locality_slack,
        cached_blocks=cached_blocks,
    )
