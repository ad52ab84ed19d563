"""One fair share across engines: what an engine publishes of its VTC counters and how it merges the others'.

Each engine's virtual counter of a key is three parts (fairness/vtc.py):

    counter = charged here + lifted here + charged on the other engines (as last heard)

Only the first part is published. "Charged" is the weighted service the scheduler charged on this engine
(`cost / weight` per chunk): it is what the key actually received here, so every engine may add it. A lift
is a local correction (a newly backlogged key is raised to within `lift_allowance` of *this* engine's
backlogged minimum); publishing it would make every other engine count it again on top of its own lift
for the same key, and a key that went quiet would pay for it once per engine. So lifts stay local.

`RemoteService` keeps the last known cumulative totals of every other engine and sums them. Each engine's
totals only grow (cumulative since it started; a restarted engine has a new id), so the merge keeps the
maximum seen per engine: a late or reordered read can never lower a counter, and the sum is monotone.
An engine whose entry expired keeps counting with its last totals: its service was delivered, and
forgetting it would hand the keys it served a second helping at the expense of those that waited
(docs/fairness.md, "Across engines").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from fairness.errors import FairnessError


class SharedCounters(Protocol):
    """The policy hook the engine's counter sync drives (VTC, and the wrappers that forward to it)."""

    def local_service(self) -> Mapping[str, float]:
        """Weighted service charged on this engine by counter name: what other engines may add (no lifts)."""

    def absorb_remote(self, totals: Mapping[str, float]) -> None:
        """The other engines' combined charged service by counter name; raises counters by what is new."""


def shares_counters(policy: object) -> bool:
    """True when `policy` has the two hooks of `SharedCounters` (VTC and the wrappers around it do)."""
    return callable(getattr(policy, "local_service", None)) and callable(
        getattr(policy, "absorb_remote", None)
    )


def class_counter(cls: int, key: str) -> str:
    """The counter name of `key` in priority class `cls`: "<cls>:<key>" (a class has no colon, a key may)."""
    return f"{cls}:{key}"


def split_class_counter(name: str) -> tuple[int, str] | None:
    """(class, key) of a name made by `class_counter`; None for a name that is not one."""
    cls, sep, key = name.partition(":")
    if not sep:
        return None
    try:
        return int(cls), key
    except ValueError:
        return None


class RemoteService:
    """The other engines' last known charged service, merged into one monotone total per counter name."""

    def __init__(self) -> None:
        self._engines: dict[str, dict[str, float]] = {}
        self._totals: dict[str, float] = {}

    def observe(self, engine_id: str, service: Mapping[str, float]) -> bool:
        """Take an engine's published totals; True when any total grew. Never lowers a total."""
        known = self._engines.setdefault(engine_id, {})
        grew = False
        for name, value in service.items():
            if not value >= 0 or value == float("inf"):
                raise FairnessError(f"engine {engine_id!r} published service {value!r} for {name!r}")
            gained = value - known.get(name, 0.0)
            if gained > 0:
                known[name] = value
                self._totals[name] = self._totals.get(name, 0.0) + gained
                grew = True
        return grew

    def totals(self) -> dict[str, float]:
        """Combined service of every engine observed, by counter name (a fresh dict)."""
        return dict(self._totals)

    def engines(self) -> list[str]:
        """Ids of every engine observed so far, the ones that stopped publishing included."""
        return list(self._engines)
