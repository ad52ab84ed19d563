"""Flat VTC over client-chosen keys (`--fairness-key user` or `api_key`) with bounded state.

End-user names are chosen by clients, so a flat per-user key would let a tenant make the engine remember
as many counters as it can invent names. Here each tenant holds at most `max_keys_per_tenant` keys besides
its own:

- an idle key (not queued) is forgotten as soon as forgetting loses nothing: its counter is at or below
  the backlogged minimum less the lift allowance, so the lift on its return gives it the same counter it
  would have had (docs/fairness.md, "Bounded state");
- when a tenant is at its cap, its idle keys are forgotten least-served first until a quarter of the cap
  is free, and if every key is queued a new name is counted as the tenant itself.

A forgotten key's charged total is kept (bounded) and restored on its return, so what other engines read
from the shared counters never goes down (fairness/shared.py).
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from typing import Any

from fairness.base import T
from fairness.cost import TokenCost
from fairness.keys import KeyFn, tenant_key
from fairness.vtc import VTCPolicy

_RETIRED_MAX = 1 << 16  # forgotten keys whose published totals are kept, all tenants together
_SWEEP_EVERY = 256  # arrivals between sweeps for lossless forgetting across tenants


class BoundedVTCPolicy(VTCPolicy[T]):
    """VTC whose client-chosen keys are bounded per tenant; behaves as VTC while under the cap."""

    def __init__(
        self, cost: TokenCost, key_fn: KeyFn, *, lift_allowance: float, max_keys_per_tenant: int
    ) -> None:
        if max_keys_per_tenant < 1:
            raise ValueError(f"max_keys_per_tenant must be >= 1, got {max_keys_per_tenant!r}")
        super().__init__(cost, self._bounded_key, lift_allowance=lift_allowance)
        self.raw_key = key_fn
        self.max_keys = max_keys_per_tenant
        self._tenant_keys: dict[str, set[str]] = defaultdict(set)  # tenant -> its remembered own keys
        self._owner: dict[str, str] = {}  # key -> tenant
        self._retired: OrderedDict[str, float] = OrderedDict()
        self._arrivals = 0

    def _bounded_key(self, item: Any) -> str:
        """The item's key, or its tenant's when the tenant is at its cap with every key queued."""
        key = self.raw_key(item)
        tenant = tenant_key(item)
        if key == tenant:
            return key
        keys = self._tenant_keys[tenant]
        if key in keys:
            return key
        if len(keys) >= self.max_keys:
            self._sweep(tenant, keep=self.max_keys - max(1, self.max_keys // 4))
            if len(keys) >= self.max_keys:
                return tenant
        keys.add(key)
        self._owner[key] = tenant
        retired = self._retired.pop(key, None)
        if retired is not None:
            self.resume(key, retired)
        return key

    def rank(self, item: T) -> tuple[float, ...]:
        """The counter of the key the item is counted under, without remembering a new name (`rank` reads)."""
        key, tenant = self.raw_key(item), tenant_key(item)
        if key != tenant and key not in self._tenant_keys.get(tenant, ()):
            key = tenant
        return (self.counter(key),)

    def add(self, item: T, now: float, front: bool = False) -> None:
        """Queue `item`; every `_SWEEP_EVERY` arrivals, forget the idle keys whose forgetting is lossless."""
        self._arrivals += 1
        if self._arrivals % _SWEEP_EVERY == 0:
            for tenant in list(self._tenant_keys):
                self._sweep(tenant, keep=None)
        super().add(item, now, front)

    def _sweep(self, tenant: str, keep: int | None) -> None:
        """Forget `tenant`'s lossless idle keys; with `keep`, then the least served until it holds `keep`."""
        keys = self._tenant_keys[tenant]
        idle = sorted((k for k in keys if not self.backlogged(k)), key=self.counter)
        floor_key = self.next_key()
        floor = None if floor_key is None else self.counter(floor_key)
        for key in idle:
            if floor is not None and self.counter(key) <= floor - self.lift_allowance / self.weight(key):
                self._forget(key)
        for key in idle:
            if keep is None or len(keys) <= keep:
                break
            if key in keys:
                self._forget(key)
        if not keys:
            del self._tenant_keys[tenant]

    def _forget(self, key: str) -> None:
        charged = self.forget(key)
        tenant = self._owner.pop(key)
        self._tenant_keys[tenant].discard(key)
        if charged:
            self._retired[key] = charged
            self._retired.move_to_end(key)
            if len(self._retired) > _RETIRED_MAX:
                self._retired.popitem(last=False)

    def keys_of(self, tenant: str) -> int:
        """How many keys of its own `tenant` holds state for now (at most `max_keys_per_tenant`)."""
        return len(self._tenant_keys.get(tenant, ()))
