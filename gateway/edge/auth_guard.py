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
    """Token buckets of allowed authentication failures per client address, LRU-bounded; optionally a
    hold for a key that keeps sending while told to wait (`refused`, used for task reports)."""

    def __init__(
        self,
        burst: int = 20,
        rate_per_s: float = 2.0,
        max_addresses: int = 10_000,
        hold_after: int = 0,
        hold_s: float = 0.0,
    ) -> None:
        if burst < 1 or rate_per_s <= 0 or max_addresses < 1:
            raise ValueError("burst and max_addresses must be >= 1 and rate_per_s > 0")
        if hold_after < 0 or (hold_after and hold_s <= 0):
            raise ValueError("hold_after must be >= 0, and hold_s > 0 when it is not 0")
        self.burst = burst
        self.rate_per_s = rate_per_s
        self.max_addresses = max_addresses
        self.hold_after = hold_after
        self.hold_s = hold_s
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # address -> (tokens, at)
        # key -> (refusal window's end, refusals ignored in it, held until): `refused` keeps it.
        self._told: OrderedDict[str, tuple[float, int, float]] = OrderedDict()

    def _tokens(self, address: str, now: float) -> float:
        tokens, at = self._buckets.get(address, (float(self.burst), now))
        return min(float(self.burst), tokens + (now - at) * self.rate_per_s)

    def retry_after(self, address: str) -> int | None:
        """Whole seconds until `address` may fail again, or None while it has budget left."""
        if address not in self._buckets:
            return None
        now = time.monotonic()
        held = self._told.get(address) if self._told else None
        if held is not None and held[2] > now:
            return max(1, math.ceil(held[2] - now))
        tokens = self._tokens(address, now)
        if tokens >= 1.0:
            return None
        return max(1, math.ceil((1.0 - tokens) / self.rate_per_s))

    def refused(self, address: str, wait: int) -> int:
        """Count one refusal of `address` told to wait `wait` s; returns the Retry-After to send.

        Why: a client that ignores Retry-After is answered 429 at whatever rate it sends, each answer a
        request's HTTP cost. A refusal opens a window as long as the wait it was given; each further
        refusal inside it is one the client did not wait for. Past `hold_after` of those the key is held
        for `hold_s` (refused whatever its bucket holds), and held again if it goes on. Several loops that
        each honour their Retry-After send one each per window, so `hold_after` above a client's loops
        spares them. 0 `hold_after`: no holds."""
        if not self.hold_after:
            return wait
        now = time.monotonic()
        window_end, ignored, held_until = self._told.get(address, (0.0, 0, 0.0))
        if now >= window_end:  # the first refusal since the last window ended: a new window
            window_end, ignored = now + wait, 0
        else:
            ignored += 1
        if ignored > self.hold_after:
            held_until, window_end, ignored = now + self.hold_s, now + self.hold_s, 0
        if held_until > now:
            wait = max(wait, math.ceil(held_until - now))
        self._told[address] = (window_end, ignored, held_until)
        self._told.move_to_end(address)
        while len(self._told) > self.max_addresses:
            self._told.popitem(last=False)
        return wait

    def held(self, address: str) -> bool:
        """Whether `address` is held for ignoring Retry-After (a longer wait than its bucket's)."""
        told = self._told.get(address)
        return told is not None and told[2] > time.monotonic()

    def charge(self, address: str) -> None:
        """Count one authentication failure of `address`."""
        now = time.monotonic()
        tokens = self._tokens(address, now)
        self._buckets[address] = (max(0.0, tokens - 1.0), now)
        self._buckets.move_to_end(address)
        while len(self._buckets) > self.max_addresses:
            self._buckets.popitem(last=False)
