"""Per-call cost of the fairness policies as the queue grows: time ratios, measured in one run.

    .venv/bin/python -m experiments.fairness_policy [--cycles N]

For each policy, one admit cycle (peek, pop, charge, add) is timed with W waiting items over K
keys; the report gives the cost relative to the smallest queue of the same policy, next to a naive
VTC peer that scans every backlogged key per peek (what the heap avoids). Flat ratios for the
real policies and growing ones for the peer mean the per-iteration cost does not depend on W or K.
"""

from __future__ import annotations

import argparse
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fairness import FairnessConfig, make_policy


@dataclass
class _Meta:
    tenant_id: str
    api_key_id: str | None = None
    user: str | None = None
    priority: int = 0
    weight: float = 1.0
    deadline: float | None = None
    arrival_time: float = 0.0


@dataclass(eq=False)
class _Item:
    request_id: str
    meta: _Meta = field(default_factory=lambda: _Meta("t0"))


class ScanVTC:
    """Peer: VTC with a linear scan over backlogged keys per peek (the textbook loop)."""

    def __init__(self) -> None:
        self.queues: dict[str, deque[_Item]] = {}
        self.counters: dict[str, float] = {}

    def add(self, item: _Item, now: float, front: bool = False) -> None:
        """Queue `item` under its tenant, lifting a newly backlogged tenant."""
        key = item.meta.tenant_id
        if key not in self.queues:
            floor = min((self.counters[k] for k in self.queues), default=0.0)
            self.counters[key] = max(self.counters.get(key, 0.0), floor)
            self.queues[key] = deque()
        self.queues[key].append(item)

    def peek(self, now: float) -> _Item | None:
        """Head of the smallest counter, by scanning."""
        if not self.queues:
            return None
        key = min(self.queues, key=self.counters.__getitem__)
        return self.queues[key][0]

    def pop(self, item: _Item) -> None:
        """Remove the admitted head."""
        key = item.meta.tenant_id
        self.queues[key].popleft()
        if not self.queues[key]:
            del self.queues[key]

    def charge(self, item: _Item, prefill: int, decode: int, cached: int) -> float:
        """Charge w_in=1, w_out=2."""
        cost = prefill + 2.0 * decode
        self.counters[item.meta.tenant_id] += cost
        return cost


POLICIES: dict[str, Callable[[], Any]] = {
    "fcfs": lambda: make_policy(FairnessConfig(policy="fcfs", priority_classes=False)),
    "vtc": lambda: make_policy(FairnessConfig(policy="vtc", priority_classes=False)),
    "vtc+classes+edf": lambda: make_policy(FairnessConfig(policy="vtc", edf=True, max_queue_age_s=1e9)),
    "scan-vtc (peer)": ScanVTC,
}


def seconds_per_cycle(make: Callable[[], Any], waiting: int, keys: int, cycles: int) -> float:
    """Mean seconds of one peek/pop/charge/add cycle at a steady `waiting` items over `keys` keys."""
    policy = make()
    for i in range(waiting):
        policy.add(_Item(f"w{i}", _Meta(f"k{i % keys}")), 0.0)
    serial = waiting
    start = time.perf_counter()
    for _ in range(cycles):
        item = policy.peek(1.0)
        policy.pop(item)
        policy.charge(item, 7, 1, 0)
        serial += 1
        policy.add(_Item(f"w{serial}", item.meta), 1.0)
    return (time.perf_counter() - start) / cycles


def main(argv: list[str] | None = None) -> None:
    """Print the cost table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=20_000)
    args = parser.parse_args(argv)
    shapes = [(1_000, 10), (10_000, 10), (100_000, 10), (10_000, 100), (10_000, 1_000)]
    print(f"{'policy':<18}" + "".join(f"{f'W={w},K={k}':>18}" for w, k in shapes))
    for name, make in POLICIES.items():
        costs = [seconds_per_cycle(make, w, k, args.cycles) for w, k in shapes]
        cells = "".join(f"{c * 1e6:>9.2f}us x{c / costs[0]:<5.2f}" for c in costs)
        print(f"{name:<18}{cells}")


if __name__ == "__main__":
    main()
