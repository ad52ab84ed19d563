"""One EngineStats for many engines: what admission, /metrics and the dashboard read from a router.

Admission (admission/feasibility.py) asks how long a newcomer waits: the cluster's queue over the
cluster's rates, so counts, token rates and capacities add up; an iteration takes as long as the
slowest engine's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any

from engine.core.outputs import EngineStats
from engine.core.trace import IterationTrace

_SLOWEST = {"iteration_seconds", "counter_sync_age_s", "counter_sync_engines"}  # the largest of them
# Per-tenant maps whose merge is the largest value, not the sum: a weight is the same on every engine, and
# a tenant backlogged on two engines at once was backlogged for that time once.
_LARGEST_MAPS = {"weights", "backlogged_s"}
_SYNC_ORDER = ("off", "ok", "stale")  # the counter sync the cluster reports is its worst engine's
# Each field's merge, worked out once from the dataclass: admission reads the stats twice per request.
_MAPS = tuple(f.name for f in fields(EngineStats) if f.default_factory is dict)
_SUMS = tuple(
    f.name
    for f in fields(EngineStats)
    if f.name not in _SLOWEST and f.name not in ("alive", "counter_sync") and f.name not in _MAPS
)


def _merge(maps: Sequence[Mapping[str, Any]], largest: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for m in maps:
        for key, value in m.items():
            out[key] = max(out[key], value) if largest and key in out else out.get(key, 0) + value
    return out


def aggregate_stats(snapshots: Sequence[EngineStats]) -> EngineStats:
    """Sum counts, rates and per-tenant maps; the slowest iteration (and stalest counter sync); alive when any is."""
    if not snapshots:
        return EngineStats(alive=False)
    if len(snapshots) == 1:
        copy = object.__new__(EngineStats)  # shallow, as the front's own stats() is
        copy.__dict__.update(snapshots[0].__dict__)
        return copy
    values: dict[str, Any] = {name: sum(getattr(s, name) for s in snapshots) for name in _SUMS}
    for name in _MAPS:
        values[name] = _merge([getattr(s, name) for s in snapshots], largest=name in _LARGEST_MAPS)
    for name in _SLOWEST:
        values[name] = max(getattr(s, name) for s in snapshots)
    values["counter_sync"] = max((s.counter_sync for s in snapshots), key=_SYNC_ORDER.index)
    values["alive"] = any(s.alive for s in snapshots)
    return EngineStats(**values)


def merge_traces(per_engine: Sequence[Sequence[IterationTrace]], n: int) -> list[IterationTrace]:
    """The last `n` iteration traces of all engines, in time order."""
    merged = sorted((t for traces in per_engine for t in traces), key=lambda t: t.time)
    return merged[-n:] if n > 0 else []
