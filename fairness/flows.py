"""Two-level fair share: VTC among tenants by weight, and inside each tenant VTC among its flows.

A flow is what a two-level key names inside a tenant (fairness/keys.py): the request's end user, its
X-Workflow-Run-Id or its API key; requests without one share the tenant's unnamed flow "". Every queued
item sits in two VTCs at once: the outer one keyed by tenant (counters grow by `cost / tenant weight`)
and its tenant's inner one keyed by flow (counters grow by `cost / flow weight`, 1 unless an admin set
a per-API-key weight). `peek` asks the outer VTC which backlogged tenant is furthest behind, then that
tenant's inner VTC which of its flows is. So the outer level is exactly today's tenant VTC (a tenant's
share does not depend on how many flows it has: the Sybil case), and the inner level is VTC again
over the tenant's own service (an agent's fan-out in one flow cannot hold back the same tenant's chat
in another by more than the inner bound). Both levels lift a newly backlogged key (fairness/vtc.py).

Bounded state. Each tenant remembers at most `max_flows_per_tenant` flows. A flow that goes idle (not
queued, nothing running) is forgotten at once when forgetting loses nothing: its counter is at or below
the lift's target, so the lift would give it the same counter on return. At the cap, idle flows with
the smallest counters are forgotten anyway (a returning flow is lifted, so it gains at most
`lift_allowance`); when every remembered flow is busy, a new flow shares the tenant's unnamed flow.

Across engines (fairness/shared.py) both levels travel: a tenant's charged service under its id, a
flow's under "<tenant>/<flow>". A forgotten flow's published total is kept in a bounded table so what
other engines read of it never goes down when it returns.
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from collections.abc import Mapping, Sequence
from typing import Any, Generic

from fairness.base import T
from fairness.bounded import BoundedVTCPolicy
from fairness.cost import TokenCost, check_weight
from fairness.keys import FLOW_SEPARATOR, KeyFn, tenant_key, user_flow
from fairness.victim import lowest_class, preemptible
from fairness.vtc import VTCPolicy


def build_vtc(
    cost: TokenCost,
    key_fn: KeyFn,
    *,
    lift_allowance: float,
    flow_fn: KeyFn | None,
    max_flows_per_tenant: int,
) -> VTCPolicy[Any] | FlowVTCPolicy[Any]:
    """The registry's "vtc": flat VTC over `key_fn` (bounded per tenant for a client-chosen key), or two-level
    (tenant, then `flow_fn`) when a flow is given."""
    if flow_fn is None and key_fn is tenant_key:
        return VTCPolicy(cost, key_fn, lift_allowance=lift_allowance)
    if flow_fn is None:  # a flat client-chosen key (user, api_key): bounded per tenant like flows
        return BoundedVTCPolicy(
            cost, key_fn, lift_allowance=lift_allowance, max_keys_per_tenant=max_flows_per_tenant
        )
    return FlowVTCPolicy(
        cost, flow_fn, lift_allowance=lift_allowance, max_flows_per_tenant=max_flows_per_tenant
    )


# Forgotten flows whose published totals are kept (all tenants together); older ones are dropped.
_RETIRED_MAX = 1 << 16


def flow_counter(tenant: str, flow: str) -> str:
    """The counter name of a tenant's flow: "<tenant>/<flow>"."""
    return f"{tenant}{FLOW_SEPARATOR}{flow}"


class FlowVTCPolicy(Generic[T]):
    """Hierarchical VTC: tenants by weight, then each tenant's flows equally (or by per-flow weight)."""

    def __init__(
        self,
        cost: TokenCost,
        flow_fn: KeyFn = user_flow,
        *,
        lift_allowance: float,
        max_flows_per_tenant: int,
    ) -> None:
        if max_flows_per_tenant < 1:
            raise ValueError(f"max_flows_per_tenant must be >= 1, got {max_flows_per_tenant!r}")
        self.cost = cost
        self.flow_fn = flow_fn
        self.lift_allowance = lift_allowance
        self.max_flows = max_flows_per_tenant
        self.outer: VTCPolicy[T] = VTCPolicy(self.cost, tenant_key, lift_allowance=lift_allowance)
        self._inner: dict[str, VTCPolicy[T]] = {}
        self._flow_of: dict[str, tuple[str, str]] = {}  # queued or running request_id -> (tenant, flow)
        self._admitted: set[str] = set()
        self._running: dict[tuple[str, str], int] = defaultdict(int)
        self._flow_weights: dict[str, float] = {}  # "<tenant>/<flow>" -> weight set by an admin
        self._retired: OrderedDict[str, float] = OrderedDict()

    # -- flows -----------------------------------------------------------------------------------

    def inner(self, tenant: str) -> VTCPolicy[T]:
        """The VTC among `tenant`'s flows (made on first use)."""
        policy = self._inner.get(tenant)
        if policy is None:
            policy = self._inner[tenant] = VTCPolicy(
                self.cost, self._flow_key, lift_allowance=self.lift_allowance, weight_fn=self._flow_weight
            )
        return policy

    def _flow_key(self, item: T) -> str:
        return self._flow(item)[1]

    def _flow_weight(self, item: T) -> float:
        tenant, flow = self._flow(item)
        return self._flow_weights.get(flow_counter(tenant, flow), 1.0)

    def _flow(self, item: T) -> tuple[str, str]:
        known = self._flow_of.get(item.request_id)
        return known if known is not None else self._resolve(item)

    def _resolve(self, item: T) -> tuple[str, str]:
        """(tenant, flow) of a new item: its own flow, or the unnamed one when the tenant is at its cap."""
        tenant = str(item.meta.tenant_id)
        flow = self.flow_fn(item)
        inner = self.inner(tenant)
        if flow and not inner.holds(flow) and inner.known() >= self.max_flows:
            self._sweep(tenant, inner)
            if inner.known() >= self.max_flows:
                flow = ""
        if not inner.holds(flow):
            retired = self._retired.pop(flow_counter(tenant, flow), None)
            if retired is not None:
                inner.resume(flow, retired)
        return tenant, flow

    def _idle(self, tenant: str, inner: VTCPolicy[T], flow: str) -> bool:
        return not inner.backlogged(flow) and not self._running.get((tenant, flow))

    def _lossless(self, inner: VTCPolicy[T], flow: str, floor: float | None) -> bool:
        """True when forgetting `flow` changes nothing: the lift on its return gives it the same counter."""
        if floor is None:
            return False
        return inner.counter(flow) <= floor - self.lift_allowance / inner.weight(flow)

    @staticmethod
    def _floor(inner: VTCPolicy[T]) -> float | None:
        """The smallest counter among the tenant's backlogged flows (what a lift aims at), or None."""
        floor_key = inner.next_key()
        return None if floor_key is None else inner.counter(floor_key)

    def _forget(self, tenant: str, inner: VTCPolicy[T], flow: str) -> None:
        charged = inner.forget(flow)
        self._running.pop((tenant, flow), None)
        if charged:
            name = flow_counter(tenant, flow)
            self._retired[name] = charged
            self._retired.move_to_end(name)
            if len(self._retired) > _RETIRED_MAX:
                self._retired.popitem(last=False)

    def _sweep(self, tenant: str, inner: VTCPolicy[T]) -> None:
        """Forget idle flows: the lossless ones, then the least served until a quarter of the cap is free."""
        idle = sorted((f for f in inner.counters() if self._idle(tenant, inner, f)), key=inner.counter)
        floor = self._floor(inner)
        for flow in idle:
            if self._lossless(inner, flow, floor):
                self._forget(tenant, inner, flow)
        target = self.max_flows - max(1, self.max_flows // 4)
        for flow in idle:
            if inner.known() <= target:
                break
            if inner.holds(flow):
                self._forget(tenant, inner, flow)

    def _release(self, item: T) -> None:
        """`item` left the queue for good or ended: drop its mapping, forget its flow if that is lossless."""
        flow_of = self._flow_of.pop(item.request_id, None)
        if flow_of is None:
            return
        tenant, flow = flow_of
        inner = self._inner[tenant]
        if (
            inner.holds(flow)
            and self._idle(tenant, inner, flow)
            and self._lossless(inner, flow, self._floor(inner))
        ):
            self._forget(tenant, inner, flow)

    # -- queue -----------------------------------------------------------------------------------

    def add(self, item: T, now: float, front: bool = False) -> None:
        """Queue `item` in its tenant and its flow (a preempted one at the head of both)."""
        rid = item.request_id
        self.outer.add(item, now, front)
        flow_of = self._flow_of.get(rid)
        if flow_of is None:
            flow_of = self._flow_of[rid] = self._resolve(item)
        if rid in self._admitted:  # preempted: queued again, no longer running
            self._admitted.discard(rid)
            self._running[flow_of] -= 1
        self.inner(flow_of[0]).add(item, now, front)

    def remove(self, item: T) -> None:
        """Drop a queued item (cancelled, expired, promoted to another class); no-op when absent."""
        flow_of = self._flow_of.get(item.request_id)
        if flow_of is None or item not in self.outer:
            return
        self.outer.remove(item)
        self._inner[flow_of[0]].remove(item)
        self._release(item)

    def peek(self, now: float) -> T | None:
        """Head of the least served flow of the least served backlogged tenant."""
        tenant = self.outer.next_key()
        return None if tenant is None else self._inner[tenant].peek(now)

    def pop(self, item: T) -> None:
        """Remove the admitted item from both levels; it counts as running in its flow until `finish`."""
        flow_of = self._flow_of[item.request_id]
        self.outer.pop(item)
        self._inner[flow_of[0]].pop(item)
        self._admitted.add(item.request_id)
        self._running[flow_of] += 1

    def rank(self, item: T) -> tuple[float, ...]:
        """Its tenant's counter, then its flow's inside the tenant: the order `peek` serves them in."""
        tenant, flow = self._flow_of.get(item.request_id) or (str(item.meta.tenant_id), self.flow_fn(item))
        inner = self._inner.get(tenant)
        return self.outer.counter(tenant), 0.0 if inner is None else inner.counter(flow)

    def finish(self, item: T) -> None:
        """`item` ended: its flow may become idle and be forgotten."""
        rid = item.request_id
        if rid in self._admitted:
            self._admitted.discard(rid)
            self._running[self._flow_of[rid]] -= 1
            self._release(item)

    # -- accounting ------------------------------------------------------------------------------

    def charge(self, item: T, prefill: int, decode: int, cached: int) -> float:
        """Charge the item's tenant (by tenant weight) and its flow (by flow weight); returns the service."""
        cost = self.outer.charge(item, prefill, decode, cached)
        self.inner(self._flow(item)[0]).charge(item, prefill, decode, cached)
        return cost

    def charge_decodes(self, items: Sequence[T]) -> float:
        """One decode token for each item, at both levels (one inner call per tenant)."""
        cost = self.outer.charge_decodes(items)
        per_tenant: dict[str, list[T]] = {}
        for item in items:
            per_tenant.setdefault(self._flow(item)[0], []).append(item)
        for tenant, group in per_tenant.items():
            self.inner(tenant).charge_decodes(group)
        return cost

    def victim(self, running: Sequence[T], for_item: T | None = None) -> T | None:
        """Within the least important class: the most served tenant, its most served flow, its latest arrival."""
        candidates = lowest_class(preemptible(running, for_item))
        if not candidates:
            return None
        outer = self.outer

        def rank(item: T) -> tuple[float, float, float]:
            tenant, flow = self._flow(item)
            return outer.counter(tenant), self.inner(tenant).counter(flow), item.meta.arrival_time

        return max(candidates, key=rank)

    def set_weight(self, key: str, weight: float) -> None:
        """A tenant's weight, or with "<tenant>/<flow>" a flow's weight inside its tenant (per-API-key weights)."""
        tenant, sep, flow = key.partition(FLOW_SEPARATOR)
        if not sep:
            self.outer.set_weight(key, weight)
            return
        self._flow_weights[key] = check_weight(key, weight)
        if tenant in self._inner:
            self._inner[tenant].set_weight(flow, weight)

    # -- across engines (fairness/shared.py) ----------------------------------------------------

    def local_service(self) -> Mapping[str, float]:
        """Charged service here: tenants under their id, flows under "<tenant>/<flow>"."""
        local = dict(self.outer.local_service())
        for tenant, inner in self._inner.items():
            for flow, value in inner.local_service().items():
                local[flow_counter(tenant, flow)] = value
        return local

    def absorb_remote(self, totals: Mapping[str, float]) -> None:
        """Other engines' service at both levels; a tenant at its flow cap takes only flows it knows."""
        outer: dict[str, float] = {}
        flows: dict[str, dict[str, float]] = defaultdict(dict)
        for name, value in totals.items():
            tenant, sep, flow = name.partition(FLOW_SEPARATOR)
            if sep:
                flows[tenant][flow] = value
            else:
                outer[name] = value
        self.outer.absorb_remote(outer)
        for tenant, group in flows.items():
            inner = self.inner(tenant)
            room = self.max_flows - inner.known()
            taken: dict[str, float] = {}
            for flow, value in group.items():
                if inner.holds(flow):
                    taken[flow] = value
                elif room > 0:
                    taken[flow] = value
                    room -= 1
            inner.absorb_remote(taken)

    # -- reports ---------------------------------------------------------------------------------

    def service(self) -> Mapping[str, float]:
        """Charged (unweighted) service by tenant."""
        return self.outer.service()

    def counters(self) -> Mapping[str, float]:
        """Virtual counters by tenant."""
        return self.outer.counters()

    def weights(self) -> Mapping[str, float]:
        """Current weight by tenant."""
        return self.outer.weights()

    def waiting(self) -> Mapping[str, int]:
        """Queued items by backlogged tenant."""
        return self.outer.waiting()

    def lifts(self) -> Mapping[str, float]:
        """Counter raised by lifts by tenant."""
        return self.outer.lifts()

    def flow_service(self) -> Mapping[str, float]:
        """Charged service by "<tenant>/<flow>" (flows remembered now)."""
        return {flow_counter(t, f): v for t, inner in self._inner.items() for f, v in inner.service().items()}

    def flow_counters(self) -> Mapping[str, float]:
        """Inner virtual counters by "<tenant>/<flow>" (flows remembered now)."""
        return {
            flow_counter(t, f): v for t, inner in self._inner.items() for f, v in inner.counters().items()
        }

    def flows_known(self, tenant: str) -> int:
        """How many flows of `tenant` hold state now (at most `max_flows_per_tenant` + the unnamed one)."""
        inner = self._inner.get(tenant)
        return 0 if inner is None else inner.known()

    def __contains__(self, item: object) -> bool:
        return item in self.outer

    def __len__(self) -> int:
        return len(self.outer)
