"""The two seams of the cluster simulator (sim/cluster.py): the counter merge and the router's score.

- `others_service` merges published per-tenant service: each engine's counter is its own cumulative
  service plus the others' last published service (docs/fairness.md, "Across engines").
- `pick_engine` scores engines over prefix affinity, outstanding work and KV use, with the inputs of the
  gateway's router (routing/score.py, which `engine` may not import, so the simulator keeps its own).

`SharedVTC` is the real `VTCPolicy` plus one method: it adds other engines' service (in counter units)
to its counters, so that ordering, lifting and victim choice all see the tenant's service everywhere.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from engine.core.request import Request
from fairness.cost import TokenCost
from fairness.vtc import VTCPolicy


def others_service(
    total_published: Mapping[str, float], own_published: Mapping[str, float], keys: Iterable[str]
) -> dict[str, float]:
    """Service every other engine last published for `keys`: the cluster total minus this engine's share.

    `total_published` sums every engine's last publication (kept incrementally by the caller, so a
    read costs O(changed keys), not O(engines · keys)); never negative.
    """
    return {key: max(0.0, total_published.get(key, 0.0) - own_published.get(key, 0.0)) for key in keys}


class SharedVTC(VTCPolicy[Request]):
    """VTC whose counters also hold the other engines' (stale) service: c_k = local_k + remote_k / w_k.

    It touches the parent's counter heap the way `charge` does (push when backlogged).
    """

    def __init__(
        self,
        cost: TokenCost,
        lift_allowance: float,
        busy_elsewhere: Callable[[str], bool] | None = None,
    ) -> None:
        super().__init__(cost, lift_allowance=lift_allowance)
        self.busy_elsewhere = busy_elsewhere
        self._remote: dict[str, float] = {}  # key -> remote service already folded into its counter
        self.dirty: set[str] = set()  # keys charged since the last publication

    def charge(self, item: Request, prefill: int, decode: int, cached: int) -> float:
        """The parent's charge, remembering the key for the next publication."""
        self.dirty.add(self.key_fn(item))
        return super().charge(item, prefill, decode, cached)

    def charge_decodes(self, items: Sequence[Request]) -> float:
        """The parent's batched decode charge, remembering the keys for the next publication."""
        key_fn, dirty = self.key_fn, self.dirty
        for item in items:
            dirty.add(key_fn(item))
        return super().charge_decodes(items)

    def _lift(self, key: str) -> None:
        """No lift for a key that still has work on another engine: it is backlogged in the cluster, and
        lifting it on every engine it reaches would erase the deficit shared counters exist to repay."""
        if self.busy_elsewhere is not None and self.busy_elsewhere(key):
            return
        super()._lift(key)

    def own_service(self) -> Mapping[str, float]:
        """This engine's charged service (no copy: the caller reads only the dirty keys)."""
        return self._service

    def set_remote(self, key: str, service: float, weight: float) -> None:
        """Fold the other engines' service for `key` into its counter (replacing what was folded before)."""
        self._weights.setdefault(key, weight)
        delta = (service - self._remote.get(key, 0.0)) / self._weights[key]
        if delta:
            self._remote[key] = service
            self._counters[key] += delta
            if key in self._backlog_seq:
                self._push(key)


@dataclass(frozen=True)
class RouteWeights:
    """Score weights; the score of an engine is affinity·hit − queue·(outstanding/M) − kv·(KV use)."""

    affinity: float = 1.0
    queue: float = 1.0
    kv: float = 0.25


@dataclass(frozen=True, slots=True)
class EngineView:
    """What a router knows of one engine when it scores it."""

    outstanding_tokens: int  # routed to it and not finished (waiting + the rest of running requests)
    capacity_tokens: int  # M: tokens its KV cache holds
    kv_use: float  # fraction of KV blocks in use
    has_prefix: bool  # the router believes it holds this tenant's prefix
    tenant_tokens: int = 0  # the part of outstanding_tokens that is this tenant's
    healthy: bool = True


def engine_score(view: EngineView, weights: RouteWeights, behind: bool = False) -> float:
    """Higher is better; an unhealthy engine is never picked while a healthy one exists.

    A tenant `behind` its share (known only when counters are shared) is scored without affinity and by
    its own outstanding work instead of the whole queue: with shared counters it has the smallest counter
    on every engine, so VTC serves it ahead of the others' queue and its wait is its own queue there.
    Without that, affinity (or a queue full of other tenants' work) pins it where its share breaks.
    """
    queued = view.tenant_tokens if behind else view.outstanding_tokens
    score = -weights.queue * queued / view.capacity_tokens - weights.kv * view.kv_use
    if not behind and view.has_prefix:
        score += weights.affinity
    return score if view.healthy else float("-inf")


def pick_engine(views: Sequence[EngineView], weights: RouteWeights, behind: bool = False) -> int:
    """Index of the best-scoring engine (ties: the lowest index). The one place to swap in routing.score."""
    best, best_score = 0, float("-inf")
    for index, view in enumerate(views):
        score = engine_score(view, weights, behind)
        if score > best_score:
            best, best_score = index, score
    return best
