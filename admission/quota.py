"""Per-tenant token quotas (per minute, per day) as token buckets: in-process memory or shared in Redis.

Tokens are reserved at admission (prompt + max_tokens) and settled to actual use when the request ends,
so admitted streams cannot overshoot a quota. A denied reservation says how long until enough tokens
have refilled (for `Retry-After`). The Redis backend runs one atomic Lua script per call, on the Redis
server's clock, with all of a tenant's keys under one hash tag; if Redis is unreachable it fails open
(default) or closed, counting it in `fairserve_quota_backend_unavailable_total` and logging, never raising.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter

log = logging.getLogger(__name__)

MINUTE_S = 60.0
DAY_S = 86_400.0
# A reservation not settled within this time (crashed gateway) keeps its tokens consumed.
RESERVATION_TTL_S = 3_600.0
FAIL_CLOSED_RETRY_S = 1.0


@dataclass
class QuotaLimits:
    """A tenant's token quotas; None means unlimited."""

    tokens_per_minute: int | None = None
    tokens_per_day: int | None = None

    def windows(self) -> list[tuple[int, float]]:
        """(limit, window seconds) of each configured quota, minute first."""
        out: list[tuple[int, float]] = []
        for limit, window in ((self.tokens_per_minute, MINUTE_S), (self.tokens_per_day, DAY_S)):
            if limit is not None:
                if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
                    raise ValueError(f"token quotas must be None or integers >= 0, got {limit!r}")
                out.append((limit, window))
        return out

    def policy(self) -> str:
        """The IETF RateLimit-Policy value, e.g. '1000;w=60, 500000;w=86400'."""
        return ", ".join(f"{limit};w={int(window)}" for limit, window in self.windows())


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


def _check_tokens(tokens: int) -> None:
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise ValueError(f"tokens must be an integer >= 0, got {tokens!r}")


def _decide(
    tokens: int, windows: list[tuple[int, float]], levels: list[float], reservation_id: str | None, policy: str
) -> QuotaDecision:
    """Build the decision from bucket levels before deduction (shared by both backends)."""
    exceeds = [w for (limit, w) in windows if tokens > limit]
    waits = [(tokens - lvl) * w / limit for (limit, w), lvl in zip(windows, levels, strict=True) if lvl < tokens and limit > 0]
    allowed = not exceeds and not waits
    after = [lvl - tokens for lvl in levels] if allowed else levels
    # The binding window: the one that denies longest, else the one with the least left.
    if exceeds:
        i = next(i for i, (limit, _) in enumerate(windows) if tokens > limit)
    elif waits:
        i = max(range(len(windows)), key=lambda j: (tokens - levels[j]) * windows[j][1] / max(windows[j][0], 1))
    else:
        i = min(range(len(windows)), key=lambda j: after[j])
    limit, window = windows[i]
    reset = (limit - after[i]) * window / limit if limit > 0 else window
    if exceeds:
        retry, reason = window, "exceeds_limit"
    elif waits:
        retry, reason = max(waits), "insufficient_tokens"
    else:
        retry, reason = 0.0, None
    return QuotaDecision(
        allowed=allowed,
        retry_after_s=retry,
        limit=limit,
        remaining=max(0, math.floor(after[i])),
        reset_s=max(0.0, reset),
        reservation_id=reservation_id if allowed else None,
        policy=policy,
        reason=reason,
    )


def _unlimited() -> QuotaDecision:
    return QuotaDecision(True, 0.0, None, None, 0.0, None, "")


class MemoryQuota:
    """Token buckets in this process (thread-safe); the default when no Redis URL is configured."""

    def __init__(self, clock: Any = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[tuple[str, float], tuple[float, float]] = {}  # (tenant, window) -> (level, ts)
        self._reservations: OrderedDict[str, tuple[str, int, float]] = OrderedDict()

    def _level(self, tenant_id: str, limit: int, window: float, now: float) -> float:
        level, ts = self._buckets.get((tenant_id, window), (float(limit), now))
        return min(float(limit), level + (now - ts) * limit / window)

    def reserve(self, tenant_id: str, tokens: int, limits: QuotaLimits) -> QuotaDecision:
        """Take `tokens` from every configured bucket of the tenant, or none of them."""
        _check_tokens(tokens)
        windows = limits.windows()
        if not windows:
            return _unlimited()
        with self._lock:
            now = self._clock()
            levels = [self._level(tenant_id, limit, w, now) for limit, w in windows]
            rid = uuid.uuid4().hex
            decision = _decide(tokens, windows, levels, rid, limits.policy())
            if decision.allowed:
                for (_, w), lvl in zip(windows, levels, strict=True):
                    self._buckets[(tenant_id, w)] = (lvl - tokens, now)
                self._reservations[rid] = (tenant_id, tokens, now)
                self._prune(now)
            return decision

    def settle(self, tenant_id: str, reservation_id: str | None, actual_tokens: int, limits: QuotaLimits) -> None:
        """Replace a reservation by the tokens actually used: refund the rest (or charge the excess); once only."""
        _check_tokens(actual_tokens)
        if reservation_id is None:
            return
        with self._lock:
            entry = self._reservations.pop(reservation_id, None)
            if entry is None or entry[0] != tenant_id:
                if entry is not None:
                    self._reservations[reservation_id] = entry
                return
            delta = entry[1] - actual_tokens
            now = self._clock()
            for limit, w in limits.windows():
                level = self._level(tenant_id, limit, w, now)
                self._buckets[(tenant_id, w)] = (min(float(limit), level + delta), now)

    def _prune(self, now: float) -> None:
        while self._reservations:
            rid, (_, _, at) = next(iter(self._reservations.items()))
            if now - at < RESERVATION_TTL_S:
                break
            del self._reservations[rid]


# KEYS: minute bucket, day bucket, reservation. ARGV: tokens, cap_m, cap_d (-1 = none), win_m, win_d, res_ttl_ms.
# Returns {allowed, level_m, level_d} with levels before deduction, as strings (Lua floats become ints otherwise).
_RESERVE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local tokens = tonumber(ARGV[1])
local caps = {tonumber(ARGV[2]), tonumber(ARGV[3])}
local wins = {tonumber(ARGV[4]), tonumber(ARGV[5])}
local levels = {-1, -1}
local ok = 1
for i = 1, 2 do
  if caps[i] >= 0 then
    local level = caps[i]
    local h = redis.call('HMGET', KEYS[i], 'l', 'ts')
    if h[1] and caps[i] > 0 then
      level = math.min(caps[i], tonumber(h[1]) + (now - tonumber(h[2])) * caps[i] / wins[i])
    end
    levels[i] = level
    if level < tokens then ok = 0 end
  end
end
if ok == 1 then
  for i = 1, 2 do
    if caps[i] >= 0 then
      local left = levels[i] - tokens
      redis.call('HSET', KEYS[i], 'l', string.format('%.6f', left), 'ts', string.format('%.6f', now))
      local ttl = wins[i]
      if caps[i] > 0 then ttl = (caps[i] - left) * wins[i] / caps[i] end
      redis.call('PEXPIRE', KEYS[i], math.ceil(ttl * 1000) + 1000)
    end
  end
  redis.call('SET', KEYS[3], tokens, 'PX', ARGV[6])
end
return {ok, string.format('%.6f', levels[1]), string.format('%.6f', levels[2])}
"""

# KEYS: minute bucket, day bucket, reservation. ARGV: actual, cap_m, cap_d, win_m, win_d. GETDEL makes it once-only.
_SETTLE_LUA = """
local reserved = redis.call('GET', KEYS[3])
if not reserved then return 0 end
redis.call('DEL', KEYS[3])
local delta = tonumber(reserved) - tonumber(ARGV[1])
if delta == 0 then return 1 end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local caps = {tonumber(ARGV[2]), tonumber(ARGV[3])}
local wins = {tonumber(ARGV[4]), tonumber(ARGV[5])}
for i = 1, 2 do
  if caps[i] > 0 then
    local level = caps[i]
    local h = redis.call('HMGET', KEYS[i], 'l', 'ts')
    if h[1] then level = math.min(caps[i], tonumber(h[1]) + (now - tonumber(h[2])) * caps[i] / wins[i]) end
    level = math.min(caps[i], level + delta)
    redis.call('HSET', KEYS[i], 'l', string.format('%.6f', level), 'ts', string.format('%.6f', now))
    redis.call('PEXPIRE', KEYS[i], math.ceil((caps[i] - level) * wins[i] / caps[i] * 1000) + 1000)
  end
end
return 1
"""


class QuotaMetrics:
    """Counts of quota decisions taken without the shared backend (`fairserve_quota_*`)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.unavailable = Counter(
            "fairserve_quota_backend_unavailable_total",
            "Quota operations that could not reach Redis, by operation and outcome (allowed/denied).",
            ["op", "outcome"],
            registry=registry,
        )


_metrics_lock = threading.Lock()
_metrics: weakref.WeakKeyDictionary[CollectorRegistry, QuotaMetrics] = weakref.WeakKeyDictionary()


def quota_metrics(registry: CollectorRegistry | None = None) -> QuotaMetrics:
    """The quota metrics on `registry` (default: the global one), created once per registry."""
    registry = REGISTRY if registry is None else registry
    with _metrics_lock:
        found = _metrics.get(registry)
        if found is None:
            found = _metrics[registry] = QuotaMetrics(registry)
        return found


class RedisQuota:
    """Token buckets in Redis shared by every gateway replica: one atomic Lua script per reserve/settle."""

    def __init__(
        self,
        url: str,
        fail_open: bool = True,
        namespace: str = "fairserve",
        registry: CollectorRegistry | None = None,
        timeout_s: float = 0.25,
    ) -> None:
        import redis

        self._errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
        self.client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        self.fail_open = fail_open
        self.namespace = namespace
        self.metrics = quota_metrics(registry)
        self._reserve = self.client.register_script(_RESERVE_LUA)
        self._settle = self.client.register_script(_SETTLE_LUA)
        self._last_log = 0.0

    def _keys(self, tenant_id: str, reservation_id: str) -> list[str]:
        # The braces are a Redis Cluster hash tag: all of one tenant's keys land on one slot.
        base = f"{self.namespace}:quota:{{{tenant_id}}}"
        return [f"{base}:m", f"{base}:d", f"{base}:r:{reservation_id}"]

    @staticmethod
    def _args(limits: QuotaLimits) -> list[float]:
        limits.windows()  # validates
        return [
            -1 if limits.tokens_per_minute is None else limits.tokens_per_minute,
            -1 if limits.tokens_per_day is None else limits.tokens_per_day,
            MINUTE_S,
            DAY_S,
        ]

    def _unavailable(self, op: str, exc: BaseException) -> None:
        outcome = "allowed" if self.fail_open or op == "settle" else "denied"
        self.metrics.unavailable.labels(op=op, outcome=outcome).inc()
        now = time.monotonic()
        if now - self._last_log > 5.0:  # a dead Redis must not flood the log at request rate
            self._last_log = now
            log.warning("quota backend unavailable (%s, failing %s): %s", op,
                        "open" if self.fail_open else "closed", exc)

    def reserve(self, tenant_id: str, tokens: int, limits: QuotaLimits) -> QuotaDecision:
        """Atomically take `tokens` from the tenant's buckets in Redis, or none of them."""
        _check_tokens(tokens)
        windows = limits.windows()
        if not windows:
            return _unlimited()
        rid = uuid.uuid4().hex
        try:
            ok, lvl_m, lvl_d = self._reserve(
                keys=self._keys(tenant_id, rid),
                args=[tokens, *self._args(limits), int(RESERVATION_TTL_S * 1000)],
            )
        except self._errors as exc:
            self._unavailable("reserve", exc)
            if self.fail_open:
                return QuotaDecision(True, 0.0, None, None, 0.0, None, limits.policy(), "backend_unavailable")
            return QuotaDecision(False, FAIL_CLOSED_RETRY_S, None, None, FAIL_CLOSED_RETRY_S, None,
                                 limits.policy(), "backend_unavailable")
        all_levels = [float(lvl_m), float(lvl_d)]
        levels = [all_levels[0]] if limits.tokens_per_minute is not None else []
        if limits.tokens_per_day is not None:
            levels.append(all_levels[1])
        decision = _decide(tokens, windows, levels, rid, limits.policy())
        if decision.allowed != bool(int(ok)):  # the script is the authority; keep the two in step
            decision.allowed = bool(int(ok))
            decision.reservation_id = rid if decision.allowed else None
        return decision

    def settle(self, tenant_id: str, reservation_id: str | None, actual_tokens: int, limits: QuotaLimits) -> None:
        """Replace a reservation by the tokens actually used, once; never raises on a Redis outage."""
        _check_tokens(actual_tokens)
        if reservation_id is None:
            return
        try:
            self._settle(keys=self._keys(tenant_id, reservation_id), args=[actual_tokens, *self._args(limits)])
        except self._errors as exc:
            self._unavailable("settle", exc)

    def ping(self) -> bool:
        """True when Redis answers."""
        try:
            return bool(self.client.ping())
        except self._errors:
            return False


def make_quota(
    redis_url: str | None,
    fail_open: bool = True,
    namespace: str = "fairserve",
    registry: CollectorRegistry | None = None,
) -> MemoryQuota | RedisQuota:
    """RedisQuota when a Redis URL is given (shared by replicas), else MemoryQuota (this process only)."""
    if redis_url:
        return RedisQuota(redis_url, fail_open=fail_open, namespace=namespace, registry=registry)
    return MemoryQuota()
