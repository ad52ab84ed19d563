"""The service cost of scheduled tokens: what a fairness counter is charged."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypeGuard

from fairness.errors import InvalidChargeError, InvalidWeightError


def item_scale(item: object) -> float:
    """An item's service multiplier: its `service_scale` (the engine's LoRA requests, engine/worker/lora/cost.py),
    else 1. `charge` applies it; `charge_decodes` is only handed items without one (engine/core/scheduler.py)."""
    scale: float = getattr(item, "service_scale", 1.0)
    return scale


@dataclass(frozen=True)
class TokenCost:
    """Linear token cost `w_in·prefill + w_out·decode + w_cached·cached` (Sheng et al. use w_in=1, w_out=2)."""

    w_in: float
    w_out: float
    w_cached: float

    def __post_init__(self) -> None:
        for name in ("w_in", "w_out", "w_cached"):
            value = getattr(self, name)
            if not _real(value) or not math.isfinite(value) or value < 0:
                raise InvalidChargeError(f"{name} must be a finite number >= 0, got {value!r}")
        # All-zero weights would freeze every counter and turn VTC into "first key wins forever".
        if self.w_in == 0 and self.w_out == 0:
            raise InvalidChargeError("w_in and w_out cannot both be 0: counters would never grow")

    def __call__(self, prefill: int, decode: int, cached: int) -> float:
        """Cost of `prefill` computed prompt tokens, `decode` generated tokens and `cached` prompt hits."""
        for name, count in (("prefill", prefill), ("decode", decode), ("cached", cached)):
            if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                raise InvalidChargeError(f"{name} token count must be an integer >= 0, got {count!r}")
        return self.w_in * prefill + self.w_out * decode + self.w_cached * cached


def check_weight(key: str, weight: object) -> float:
    """Return `weight` as a float, or raise InvalidWeightError unless it is positive and finite."""
    if not _real(weight) or not math.isfinite(weight) or weight <= 0:
        raise InvalidWeightError(
            f"weight for fairness key {key!r} must be a positive finite number, got {weight!r}"
        )
    return float(weight)


def _real(x: object) -> TypeGuard[float]:
    return isinstance(x, (int, float)) and not isinstance(x, bool)
