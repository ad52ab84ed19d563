"""The policy registry: the one list of base fairness policies that the CLI, settings and admission read.

A new policy is its own module (a class that satisfies `SchedulingPolicy`) plus one `PolicyEntry` line in
`POLICIES` below: `build(cost, key_fn, **configure(config))` makes it. `fairserve serve --policy` offers
the registry's names, `FairnessConfig` accepts only them, and the gateway tells admission whether the chosen policy
interleaves tenants from the entry's `interleaves_tenants`, so nothing else names a policy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fairness.fcfs import FCFSPolicy
from fairness.flows import build_vtc
from fairness.keys import flow_function
from fairness.locality import build_locality_vtc

if TYPE_CHECKING:
    from fairness.config import FairnessConfig


@dataclass(frozen=True)
class PolicyEntry:
    """One base policy: how to build it and what admission may assume about its order."""

    name: str
    build: Callable[..., Any]  # (cost, key_fn, **configure(config)) -> the policy
    # True when a tenant waits only behind its own backlog and a fair share of the others' (VTC), so
    # admission's start-time estimate caps other tenants' queued work at the tenant's own depth; False
    # when the queue is served in arrival order and everyone's queued work counts (FCFS).
    interleaves_tenants: bool
    summary: str
    # The policy's own knobs from the FairnessConfig, as keyword arguments of `build` (none by default).
    configure: Callable[[FairnessConfig], dict[str, Any]] = lambda config: {}
    # True when it keeps counters other engines' service can raise (fairness/shared.py), so engines
    # sharing a Redis keep one fair share (EngineConfig.redis_url); arrival order has nothing to share.
    shares_counters: bool = False
    # True when `build` takes `cached_blocks` (item -> leading prompt blocks cached now): the engine's
    # probe of its KV pool, for a policy that ranks by prefix locality (fairness/locality.py).
    uses_cached_blocks: bool = False


POLICIES: dict[str, PolicyEntry] = {
    entry.name: entry
    for entry in (
        PolicyEntry(
            "vtc",
            build_vtc,
            True,
            "Virtual Token Counter fair share (the default; two levels with a tenant/<flow> key)",
            configure=lambda config: {
                "lift_allowance": config.lift_allowance,
                "flow_fn": flow_function(config.key),
                "max_flows_per_tenant": config.max_flows_per_tenant,
            },
            shares_counters=True,
        ),
        PolicyEntry("fcfs", FCFSPolicy, False, "first come, first served across tenants"),
        PolicyEntry(
            "vtc-locality",
            build_locality_vtc,
            True,
            "VTC that admits, among keys within locality_slack of the least served, the request with the "
            "most cached prefix blocks (bound: VTC's + locality_slack)",
            configure=lambda config: {
                "lift_allowance": config.lift_allowance,
                "locality_slack": config.locality_slack,
            },
            shares_counters=True,
            uses_cached_blocks=True,
        ),
    )
}
DEFAULT_POLICY = "vtc"


def policy_entry(name: str) -> PolicyEntry:
    """The registered policy called `name`; ValueError naming the choices otherwise."""
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown fairness policy {name!r}: choose one of {', '.join(POLICIES)}") from None
