"""Per-tenant token quotas (per minute, per day) over sliding windows: in-process memory or shared in Redis.

Tokens are reserved at admission (prompt + max_tokens) and settled to actual use when the request ends,
so admitted streams cannot overshoot a quota. `tokens_per_minute` and `tokens_per_day` hold over **any**
window of that length (admission/sliding_window.py says how and at what price). A denied reservation says
how long until enough tokens have left the window (for `Retry-After`). Both backends share the decision
arithmetic below; the Redis one (admission/quota_redis.py) runs one atomic Lua script per call on the
Redis server's clock and degrades instead of raising when Redis is unreachable.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Protocol

from admission.sliding_window import DAY, MINUTE, SlidingWindow, WindowSpec

# A reservation not settled within this time (crashed gateway) keeps its tokens consumed.
RESERVATION_TTL_S = 3_600.0


@dataclass
class QuotaLimits:
    """A tenant's token quotas; None means unlimited."""

    tokens_per_minute: int | None = None
    tokens_per_day: int | None = None

    def windows(self) -> list[tuple[int, WindowSpec]]:
        """(limit, window) of each configured quota, minute first."""
        out: list[tuple[int, WindowSpec]] = []
        for limit, spec in ((self.tokens_per_minute, MINUTE), (self.tokens_per_day, DAY)):
            if limit is not None:
                if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
                    raise ValueError(f"token quotas must be None or integers >= 0, got {limit!r}")
                out.append((limit, spec))
        return out

    def policy(self) -> str:
        """The IETF RateLimit-Policy value, e.g. '1000;w=60, 500000;w=86400'."""
        return ", ".join(f"{limit};w={int(spec.seconds)}" for limit, spec in self.windows())


@dataclass
class QuotaDecision:
    """The answer to one reservation; `limit`/`remaining`/`reset_s` describe the binding window."""

    allowed: bool
    retry_after_s: float
    limit: int | None
    remaining: int | None
    reset_s: float
    reservation_id: str | None
    policy: str
    reason: str | None = None  # None | "insufficient_tokens" | "exceeds_limit" | "backend_unavailable"
    window_s: float = 0.0  # the binding window's length (60: per minute, 86400: per day); 0 without one

    def limit_text(self) -> str:
        """The binding limit as a refusal names it, e.g. '200 tokens per minute'."""
        per = {60.0: "minute", 86_400.0: "day"}.get(self.window_s, f"{self.window_s:g} s")
        return f"{self.limit} tokens per {per}"


@dataclass
class WindowView:
    """One window as a backend saw it at the reservation: tokens counted before it, and the waits."""

    limit: int
    seconds: float
    used: int
    wait_s: float  # until enough counted tokens leave for this reservation to fit; 0 when it fits
    next_free_s: float  # until the oldest counted tokens leave (after this reservation, if admitted)


class QuotaStore(Protocol):
    """What the gateway needs of a quota backend (MemoryQuota, RedisQuota)."""

    async def reserve(self, tenant_id: str, tokens: int, limits: QuotaLimits) -> QuotaDecision: ...

    async def peek(self, tenant_id: str, limits: QuotaLimits) -> QuotaDecision: ...

    async def settle(
        self, tenant_id: str, reservation_id: str | None, actual_tokens: int, limits: QuotaLimits
    ) -> None: ...

    async def close(self) -> None: ...


def check_tokens(tokens: int) -> None:
    """Refuse anything but an integer >= 0 (a bool is not a token count)."""
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise ValueError(f"tokens must be an integer >= 0, got {tokens!r}")


def decide(tokens: int, views: list[WindowView], reservation_id: str | None, policy: str) -> QuotaDecision:
    """Build the decision from what every window counted before this reservation (shared by both backends)."""
    exceeds = [i for i, v in enumerate(views) if tokens > v.limit]
    waits = [i for i, v in enumerate(views) if v.wait_s > 0 or v.used + tokens > v.limit]
    allowed = not exceeds and not waits
    left = [v.limit - v.used - (tokens if allowed else 0) for v in views]
    if exceeds:
        i, retry, reason = exceeds[0], views[exceeds[0]].seconds, "exceeds_limit"
    elif waits:
        i = max(waits, key=lambda j: views[j].wait_s)
        retry, reason = max(views[i].wait_s, 0.001), "insufficient_tokens"
    else:
        i, retry, reason = min(range(len(views)), key=lambda j: left[j]), 0.0, None
    return QuotaDecision(
        allowed=allowed,
        retry_after_s=retry,
        limit=views[i].limit,
        remaining=max(0, left[i]),
        reset_s=max(0.0, views[i].next_free_s),
        reservation_id=reservation_id if allowed else None,
        policy=policy,
        reason=reason,
        window_s=views[i].seconds,
    )


def unlimited() -> QuotaDecision:
    """The decision for a tenant without quotas: nothing to reserve or settle."""
    return QuotaDecision(True, 0.0, None, None, 0.0, None, "")


class MemoryQuota:
    """Sliding windows in this process (thread-safe); the default when no Redis URL is configured.

    The work is synchronous (`reserve_now`, `settle_now`: a lock and a few dict operations, never I/O);
    the async methods are the `QuotaStore` face the gateway awaits, like RedisQuota's.
    """

    def __init__(self, clock: Any = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._windows: dict[tuple[str, WindowSpec], SlidingWindow] = {}
        # reservation id -> (tenant, tokens, taken at, [(window, slot it was counted in)])
        self._reservations: OrderedDict[str, tuple[str, int, float, list[tuple[WindowSpec, int]]]] = (
            OrderedDict()
        )

    def _window(self, tenant_id: str, spec: WindowSpec) -> SlidingWindow:
        found = self._windows.get((tenant_id, spec))
        if found is None:
            found = self._windows[(tenant_id, spec)] = SlidingWindow(spec)
        return found

    def reserve_now(self, tenant_id: str, tokens: int, limits: QuotaLimits) -> QuotaDecision:
        """Count `tokens` in every configured window of the tenant, or in none of them."""
        check_tokens(tokens)
        windows = limits.windows()
        if not windows:
            return unlimited()
        with self._lock:
            now = self._clock()
            counters = [self._window(tenant_id, spec) for _, spec in windows]
            slots = [c.advance(now) for c in counters]
            used = [c.used for c in counters]
            waits = [
                c.wait_s(u + tokens - limit, now)
                for c, u, (limit, _) in zip(counters, used, windows, strict=True)
            ]
            allowed = all(
                tokens <= limit and u + tokens <= limit for u, (limit, _) in zip(used, windows, strict=True)
            )
            rid = uuid.uuid4().hex if allowed and tokens > 0 else None
            if allowed:
                for c, s in zip(counters, slots, strict=True):
                    c.add(s, tokens)
                if rid is not None:
                    self._reservations[rid] = (
                        tenant_id,
                        tokens,
                        now,
                        [(spec, s) for (_, spec), s in zip(windows, slots, strict=True)],
                    )
                self._prune(now)
            views = [
                WindowView(limit, spec.seconds, u, w, c.next_free_s(now))
                for (limit, spec), u, w, c in zip(windows, used, waits, counters, strict=True)
            ]
            return decide(tokens, views, rid, limits.policy())

    def peek_now(self, tenant_id: str, limits: QuotaLimits) -> QuotaDecision:
        """The tenant's windows as they stand, counting nothing (for RateLimit headers on a refusal)."""
        windows = limits.windows()
        if not windows:
            return unlimited()
        with self._lock:
            now = self._clock()
            counters = [self._window(tenant_id, spec) for _, spec in windows]
            for c in counters:
                c.advance(now)
            views = [
                WindowView(limit, spec.seconds, c.used, 0.0, c.next_free_s(now))
                for (limit, spec), c in zip(windows, counters, strict=True)
            ]
            return decide(0, views, None, limits.policy())

    def settle_now(self, tenant_id: str, reservation_id: str | None, actual_tokens: int) -> None:
        """Replace a reservation by the tokens actually used: refund the rest (or count the excess now); once only."""
        check_tokens(actual_tokens)
        if reservation_id is None:
            return
        with self._lock:
            entry = self._reservations.pop(reservation_id, None)
            if entry is None or entry[0] != tenant_id:
                if entry is not None:
                    self._reservations[reservation_id] = entry
                return
            reserved, slots = entry[1], entry[3]
            now = self._clock()
            for spec, slot in slots:
                counter = self._window(tenant_id, spec)
                current = counter.advance(now)
                if actual_tokens < reserved:
                    counter.refund(slot, reserved - actual_tokens)
                else:
                    counter.add(current, actual_tokens - reserved)

    async def reserve(self, tenant_id: str, tokens: int, limits: QuotaLimits) -> QuotaDecision:
        """`reserve_now`, as the gateway awaits it."""
        return self.reserve_now(tenant_id, tokens, limits)

    async def peek(self, tenant_id: str, limits: QuotaLimits) -> QuotaDecision:
        """`peek_now`, as the gateway awaits it."""
        return self.peek_now(tenant_id, limits)

    async def settle(
        self, tenant_id: str, reservation_id: str | None, actual_tokens: int, limits: QuotaLimits
    ) -> None:
        """`settle_now`, as the gateway awaits it (the reservation remembers its windows)."""
        self.settle_now(tenant_id, reservation_id, actual_tokens)

    async def close(self) -> None:
        """Nothing to release."""

    def _prune(self, now: float) -> None:
        while self._reservations:
            rid, entry = next(iter(self._reservations.items()))
            if now - entry[2] < RESERVATION_TTL_S:
                break
            del self._reservations[rid]


def make_quota(
    redis: Any = None, fail_open: bool = True, registry: Any = None, namespace: str = "fairserve"
) -> QuotaStore:
    """RedisQuota over a `RedisLink` (shared by replicas) when one is given, else MemoryQuota (this process only)."""
    if redis is not None:
        from admission.quota_redis import RedisQuota

        return RedisQuota(redis, fail_open=fail_open, namespace=namespace, registry=registry)
    return MemoryQuota()
