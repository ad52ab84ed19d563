"""Whether a comparison's rounds agree enough to report its effect.

A ratio measured once on a shared machine can be noise: `fairserve bench --quick` once read fairserve 4x slower
than transformers while another job ran, and 2.2x faster alone a minute later. So every comparison runs its
sides in alternating rounds, reports each round, and gives its effect only when the rounds disagree by less
than the effect itself; otherwise it says "inconclusive" and shows the spread instead of a number.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any


def ratio_verdict(per_round: Sequence[float]) -> dict[str, Any]:
    """A ratio (e.g. fairserve ÷ a peer's tokens/s) from its rounds: conclusive when the rounds' spread in
    log space is smaller than the median's distance from 1 (no effect)."""
    rounds = [r for r in per_round if r > 0 and math.isfinite(r)]
    if len(rounds) < 2:
        return {"rounds": list(rounds), "conclusive": False, "text": "inconclusive (fewer than two rounds)"}
    median = statistics.median(rounds)
    low, high = min(rounds), max(rounds)
    effect, disagreement = abs(math.log(median)), math.log(high) - math.log(low)
    conclusive = disagreement < effect
    spread = f"rounds {low:.2f}-{high:.2f}x"
    return {
        "rounds": rounds,
        "median": median,
        "spread": [low, high],
        "conclusive": conclusive,
        "text": f"{median:.2f}x ({spread})" if conclusive else f"inconclusive ({spread})",
    }


def difference_verdict(per_round: Sequence[float], unit: str = "ms") -> dict[str, Any]:
    """A difference (e.g. latency a gateway adds) from its rounds: conclusive when the rounds' range is
    smaller than the median's distance from 0."""
    rounds = [r for r in per_round if math.isfinite(r)]
    if len(rounds) < 2:
        return {"rounds": list(rounds), "conclusive": False, "text": "inconclusive (fewer than two rounds)"}
    median = statistics.median(rounds)
    low, high = min(rounds), max(rounds)
    conclusive = high - low < abs(median)
    spread = f"rounds {low:+.1f} to {high:+.1f} {unit}"
    return {
        "rounds": rounds,
        "median": median,
        "spread": [low, high],
        "conclusive": conclusive,
        "text": f"{median:+.1f} {unit} ({spread})" if conclusive else f"inconclusive ({spread})",
    }
