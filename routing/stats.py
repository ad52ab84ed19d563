"""One EngineStats for many engines: what admission, /metrics and the dashboard read from a router.

Admission (admission/feasibility.py) asks how long a newcomer waits: the cluster's queue over the
cluster's rates, so counts, token rates and capacities add up; an iteration takes as long as the
slowest engine's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any

from engine.outputs import EngineStats
from engine.trace import IterationTrace

_SLOWEST = {"iteration_seconds"}


def _merge(maps: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for m in maps:
        for key, value in m.items():
            out[key] = out.get(key, 0) + value
    return out


def aggregate_stats(snapshots: Sequence[EngineStats]) -> EngineStats:
    """Sum counts, rates and per-tenant maps; the slowest iteration; alive when any engine is."""
    if not snapshots:
        return EngineStats(alive=False)
    values: dict[str, Any] = {}
    for f in fields(EngineStats):
        parts = [getattr(s, f.name) for s in snapshots]
        if f.name == "alive":
            values[f.name] = any(parts)
        elif f.name in _SLOWEST:
            values[f.name] = max(parts)
        elif isinstance(parts[0], dict):
            values[f.name] = _merge(parts)
        else:
            values[f.name] = sum(parts)
    return EngineStats(**values)


def merge_traces(per_engine: Sequence[Sequence[IterationTrace]], n: int) -> list[IterationTrace]:
    """The last `n` iteration traces of all engines, in time order."""
    merged = sorted((t for traces in per_engine for t in traces), key=lambda t: t.time)
    return merged[-n:] if n > 0 else []
