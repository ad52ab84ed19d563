"""The policy registry: the one list of base fairness policies that the CLI, settings and admission read.

A new policy is its own module (a class that satisfies `SchedulingPolicy`) plus one `PolicyEntry` line in
`POLICIES` below, whose `build` makes it from the cost, the key function and the `FairnessConfig`. `fairserve serve --policy` offers the registry's names,
`FairnessConfig` accepts only them, and the gateway tells admission whether the chosen policy
interleaves tenants from the entry's `interleaves_tenants`, so nothing else names a policy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fairness.cost import TokenCost
from fairness.fcfs import FCFSPolicy
from fairness.keys import KeyFn
from fairness.vtc import VTCPolicy

if TYPE_CHECKING:
    from fairness.config import FairnessConfig


@dataclass(frozen=True)
class PolicyEntry:
    """One base policy: how to build it and what admission may assume about its order."""

    name: str
    build: Callable[[TokenCost, KeyFn, FairnessConfig], Any]
    # True when a tenant waits only behind its own backlog and a fair share of the others' (VTC), so
    # admission's start-time estimate caps other tenants' queued work at the tenant's own depth; False
    # when the queue is served in arrival order and everyone's queued work counts (FCFS).
    interleaves_tenants: bool
    summary: str


POLICIES: dict[str, PolicyEntry] = {
    entry.name: entry
    for entry in (
        PolicyEntry("vtc", lambda cost, key_fn, config: VTCPolicy(cost, key_fn, config.lift_allowance), True,
                    "Virtual Token Counter fair share (the default)"),
        PolicyEntry("fcfs", lambda cost, key_fn, config: FCFSPolicy(cost, key_fn), False,
                    "first come, first served across tenants"),
    )
}
DEFAULT_POLICY = "vtc"


def policy_entry(name: str) -> PolicyEntry:
    """The registered policy called `name`; ValueError naming the choices otherwise."""
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown fairness policy {name!r}: choose one of {', '.join(POLICIES)}") from None
