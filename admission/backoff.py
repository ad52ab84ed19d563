"""Retry-After and RateLimit headers: telling clients when to come back, with jitter against herds."""

from __future__ import annotations

import math
import random

# The longest Retry-After every popular client honours: openai-python gives up above 120 s and
# anthropic-sdk-python ignores values above 60 s. The gateway turns longer waits into a 503 that says so.
RETRY_AFTER_CAP_S = 60
# A per-minute token quota is a sliding window of 1 s slots (admission/sliding_window.py), so its honest wait
# is up to 61 s after a reservation. Such a wait is still answered as a capped 429: a client back at 60 s
# is at worst told to wait one more second, which beats turning every per-minute refusal into a 503.
CAP_SLACK_S = 1.0


def retry_after_seconds(estimate_s: float, jitter: float, rng: random.Random) -> int:
    """Whole seconds for `Retry-After`: the estimate stretched by up to `jitter` (a fraction), at least 1.

    Jitter only lengthens the wait, so a client that obeys it never returns before the estimate; an
    estimate within `RETRY_AFTER_CAP_S` stays within it (the jitter is cut there), so only a wait
    that is really longer than the cap (by more than `CAP_SLACK_S`) is answered as one.
    """
    if not math.isfinite(estimate_s) or estimate_s < 0:
        estimate_s = 0.0
    stretched = estimate_s * (1.0 + rng.uniform(0.0, max(jitter, 0.0)))
    # Jitter whole seconds too: many clients told "1" would otherwise all return together.
    spread = rng.uniform(0.0, max(jitter, 0.0))
    seconds = max(1, math.ceil(stretched + spread))
    if estimate_s <= RETRY_AFTER_CAP_S + CAP_SLACK_S:
        seconds = min(seconds, RETRY_AFTER_CAP_S)
    return seconds


def ratelimit_headers(policy: str, limit: int, remaining: int, reset_s: float) -> dict[str, str]:
    """`RateLimit-Policy` (as the quota states it, e.g. `1000;w=60`) and `RateLimit` for the binding window."""
    return {
        "RateLimit-Policy": policy,
        "RateLimit": f"limit={max(int(limit), 0)}, remaining={max(int(remaining), 0)}, reset={max(math.ceil(reset_s), 0)}",
    }
