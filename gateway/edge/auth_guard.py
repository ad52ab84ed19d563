"""Per-client-address budget of authentication failures: past it, 429 + Retry-After before any key lookup.

Why: an unknown but well-formed key can only be refused after a store lookup (a thread and a SQL query);
a caller cycling through random keys would make every one of them cost that. Each address gets a token
bucket of failures (`burst`, refilled at `rate_per_s`); a key already in the cache is served regardless,
so a paying tenant behind the same address is not refused. Hand-written rather than a library: it is a
bounded dict of two floats per address with no I/O, and per process on purpose (a shared store would put a
network round trip back on the failure path this exists to make cheap).

The address is the trusted client address: the TCP peer, or, from a proxy named in `--forwarded-allow-ips`,
the address that proxy put in X-Forwarded-For (uvicorn's proxy headers rewrite the scope's client). From
any other peer X-Forwarded-For is ignored: any caller can send one (docs/gateway.md, "Connections").
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict


class FailureBudget:
    """Token buckets of allowed authentication failures per client address, LRU-bounded."""

    def __init__(self, burst: int = 20, rate_per_s: float = 2.0, max_addresses: int = 10_000) -> None:
        if burst < 1 or rate_per_s <= 0 or max_addresses < 1:
            raise ValueError("burst and max_addresses must be >= 1 and rate_per_s > 0")
        self.burst = burst
        self.rate_per_s = rate_per_s
        self.max_addresses = max_addresses
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # address -> (tokens, at)

    def _tokens(self, address: str, now: float) -> float:
        tokens, at = self._buckets.get(address, (float(self.burst), now))
        return min(float(self.burst), tokens + (now - at) * self.rate_per_s)

    def retry_after(self, address: str) -> int | None:
        """Whole seconds until `address` may fail again, or None while it has budget left."""
        if address not in self._buckets:
            return None
        tokens = self._tokens(address, time.monotonic())
        if tokens >= 1.0:
            return None
        return max(1, math.ceil((1.0 - tokens) / self.rate_per_s))

    def charge(self, address: str) -> None:
        """Count one authentication failure of `address`."""
        now = time.monotonic()
        tokens = self._tokens(address, now)
        self._buckets[address] = (max(0.0, tokens - 1.0), now)
        self._buckets.move_to_end(address)
        while len(self._buckets) > self.max_addresses:
            self._buckets.popitem(last=False)
