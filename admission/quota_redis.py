"""Sliding-window quotas in Redis, shared by every gateway replica: one atomic Lua script per reserve/settle.

The scripts run admission/sliding_window.py's steps on the Redis server's clock (one clock for all
replicas). Keys per tenant: `<ns>:quota:{<tenant>}:m` and `:d` (hashes: slot index -> tokens, plus `o`
oldest live slot, `n` newest slot, `u` tokens counted), and `:r:<id>` per open reservation ("tokens
minute-slot day-slot"). The braces are a Redis Cluster hash tag: all of one tenant's keys share a slot.
Each call expires at most the slots that left the window since the last call (amortised O(1)); only a
denial walks the live slots (at most 61 or 145) to say when enough tokens will have left.

Every call goes through the `RedisLink` breaker. When Redis is down, frozen or the breaker is open,
`reserve` fails open (allowed, `reason="backend_unavailable"`) or closed (denied, same reason, with the
breaker's time to the next probe as the retry), `settle` drops the refund, and both count it in
`fairserve_quota_backend_unavailable_total{op,outcome}`; neither raises.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
import weakref
from typing import Any

import redis
from prometheus_client import REGISTRY, CollectorRegistry, Counter

from admission.breaker import BackendUnavailable
from admission.quota import (
    RESERVATION_TTL_S,
    QuotaDecision,
    QuotaLimits,
    WindowView,
    check_tokens,
    decide,
    unlimited,
)
from admission.redis_link import RedisLink, own_link
from admission.sliding_window import DAY, MINUTE

log = logging.getLogger(__name__)

_WINDOW_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000

local function load(key, g, n)
  local h = redis.call('HMGET', key, 'o', 'n', 'u')
  local w = {key = key, g = g, n = n, o = tonumber(h[1]), nw = tonumber(h[2]), u = tonumber(h[3]) or 0}
  w.s = math.floor(now / g)
  if w.nw and w.s < w.nw then w.s = w.nw end
  local cutoff = w.s - n
  if w.o == nil or w.nw < cutoff then
    if w.o ~= nil then redis.call('DEL', key) end
    w.o = nil; w.nw = nil; w.u = 0
    return w
  end
  local k = w.o
  while k <= w.nw do
    local v = tonumber(redis.call('HGET', key, k) or '0')
    if k >= cutoff and v > 0 then break end
    redis.call('HDEL', key, k)
    w.u = w.u - v
    k = k + 1
  end
  if k > w.nw then
    redis.call('DEL', key); w.o = nil; w.nw = nil; w.u = 0
  else
    w.o = k
  end
  return w
end

local function save(w)
  if w.o == nil then return end
  redis.call('HSET', w.key, 'o', w.o, 'n', w.nw, 'u', w.u)
  redis.call('PEXPIRE', w.key, math.ceil((w.n + 2) * w.g * 1000))
end

local function add(w, tokens)
  if tokens <= 0 then return end
  redis.call('HINCRBY', w.key, w.s, tokens)
  w.u = w.u + tokens
  if w.o == nil then w.o = w.s end
  w.nw = w.s
end
"""

# KEYS: minute window, day window, reservation. ARGV: tokens, cap_m, cap_d (-1 = none), g_m, n_m, g_d, n_d,
# reservation ttl ms. Returns {ok, used_m, wait_m, free_m, used_d, wait_d, free_d}, numbers as strings
# (Lua floats would be truncated to integers); a wait of -1 means never (more than the limit).
_RESERVE_LUA = (
    _WINDOW_LUA
    + """
local function wait_for(w, need)
  if need <= 0 then return 0 end
  if w.o == nil then return -1 end
  local freed = 0
  for k = w.o, w.nw do
    freed = freed + tonumber(redis.call('HGET', w.key, k) or '0')
    if freed >= need then return (k + w.n + 1) * w.g - now end
  end
  return -1
end

local tokens = tonumber(ARGV[1])
local caps = {tonumber(ARGV[2]), tonumber(ARGV[3])}
local specs = {{tonumber(ARGV[4]), tonumber(ARGV[5])}, {tonumber(ARGV[6]), tonumber(ARGV[7])}}
local ws, used, waits, slots = {}, {0, 0}, {0, 0}, {-1, -1}
local ok = 1
for i = 1, 2 do
  if caps[i] >= 0 then
    local w = load(KEYS[i], specs[i][1], specs[i][2])
    ws[i] = w
    used[i] = w.u
    waits[i] = wait_for(w, w.u + tokens - caps[i])
    if tokens > caps[i] or w.u + tokens > caps[i] then ok = 0 end
  end
end
if ok == 1 then
  for i = 1, 2 do
    if ws[i] then add(ws[i], tokens); slots[i] = ws[i].s end
  end
  if tokens > 0 then
    redis.call('SET', KEYS[3], tokens .. ' ' .. slots[1] .. ' ' .. slots[2], 'PX', ARGV[8])
  end
end
local out = {ok}
for i = 1, 2 do
  local free = 0
  local w = ws[i]
  if w then
    save(w)
    if w.o ~= nil and w.u > 0 then free = math.max(0, (w.o + w.n + 1) * w.g - now) end
  end
  out[#out + 1] = string.format('%d', used[i])
  out[#out + 1] = string.format('%.6f', waits[i])
  out[#out + 1] = string.format('%.6f', free)
end
return out
"""
)

# KEYS: minute window, day window, reservation. ARGV: actual tokens, g_m, n_m, g_d, n_d. Once only: the
# reservation key is deleted by the first settle.
_SETTLE_LUA = (
    _WINDOW_LUA
    + """
local rec = redis.call('GET', KEYS[3])
if not rec then return 0 end
redis.call('DEL', KEYS[3])
local reserved, s1, s2 = string.match(rec, '^(%d+) (%-?%d+) (%-?%d+)$')
local delta = tonumber(reserved) - tonumber(ARGV[1])
if delta == 0 then return 1 end
local slots = {tonumber(s1), tonumber(s2)}
local specs = {{tonumber(ARGV[2]), tonumber(ARGV[3])}, {tonumber(ARGV[4]), tonumber(ARGV[5])}}
for i = 1, 2 do
  if slots[i] >= 0 then
    local w = load(KEYS[i], specs[i][1], specs[i][2])
    if delta > 0 then
      local have = tonumber(redis.call('HGET', w.key, slots[i]) or '0')
      local take = math.min(delta, have)
      if take > 0 then
        redis.call('HINCRBY', w.key, slots[i], -take)
        w.u = w.u - take
      end
    else
      add(w, -delta)
    end
    save(w)
  end
end
return 1
"""
)

# KEYS: minute window, day window. ARGV: cap_m, cap_d (-1 = none), g_m, n_m, g_d, n_d. Counts nothing (it
# only drops slots that left the window, as every script does); returns {used_m, free_m, used_d, free_d}.
_PEEK_LUA = (
    _WINDOW_LUA
    + """
local caps = {tonumber(ARGV[1]), tonumber(ARGV[2])}
local specs = {{tonumber(ARGV[3]), tonumber(ARGV[4])}, {tonumber(ARGV[5]), tonumber(ARGV[6])}}
local out = {}
for i = 1, 2 do
  local used, free = 0, 0
  if caps[i] >= 0 then
    local w = load(KEYS[i], specs[i][1], specs[i][2])
    save(w)
    used = w.u
    if w.o ~= nil and w.u > 0 then free = math.max(0, (w.o + w.n + 1) * w.g - now) end
  end
  out[#out + 1] = string.format('%d', used)
  out[#out + 1] = string.format('%.6f', free)
end
return out
"""
)

_SPECS = [MINUTE.slot_s, MINUTE.slots, DAY.slot_s, DAY.slots]


def _caps(limits: QuotaLimits) -> list[int]:
    """The scripts' caps: each window's limit, -1 where the tenant has none."""
    return [
        -1 if limits.tokens_per_minute is None else limits.tokens_per_minute,
        -1 if limits.tokens_per_day is None else limits.tokens_per_day,
    ]


class QuotaMetrics:
    """Counts of quota operations done without the shared backend (`fairserve_quota_*`)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.unavailable = Counter(
            "fairserve_quota_backend_unavailable_total",
            "Quota operations that could not reach Redis, by operation and outcome "
            "(reserve: allowed = failed open, denied = failed closed; settle: lost = refund not applied).",
            ["op", "outcome"],
            registry=registry,
        )
        for op, outcome in (("reserve", "allowed"), ("reserve", "denied"), ("settle", "lost")):
            self.unavailable.labels(op=op, outcome=outcome)  # exported at 0 from the start


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
    """Sliding windows in Redis shared by every gateway replica (see the module docstring)."""

    def __init__(
        self,
        link: RedisLink | str,
        fail_open: bool = True,
        namespace: str = "fairserve",
        registry: CollectorRegistry | None = None,
        timeout_s: float | None = None,
    ) -> None:
        self.link = own_link(link, timeout_s)
        self._owns_link = isinstance(link, str)
        self.client = self.link.client
        self.fail_open = fail_open
        self.namespace = namespace
        self.metrics = quota_metrics(registry)
        self._reserve = self.client.register_script(_RESERVE_LUA)
        self._settle = self.client.register_script(_SETTLE_LUA)
        self._peek = self.client.register_script(_PEEK_LUA)
        self._last_log = 0.0

    def _keys(self, tenant_id: str, reservation_id: str) -> list[str]:
        base = f"{self.namespace}:quota:{{{tenant_id}}}"
        return [f"{base}:m", f"{base}:d", f"{base}:r:{reservation_id}"]

    def _unavailable(self, op: str, exc: BaseException) -> None:
        outcome = (
            "lost"
            if op == "settle"
            else "skipped"
            if op == "peek"
            else "allowed"
            if self.fail_open
            else "denied"
        )
        self.metrics.unavailable.labels(op=op, outcome=outcome).inc()
        now = time.monotonic()
        if now - self._last_log > 5.0:  # a dead Redis must not flood the log at request rate
            self._last_log = now
            log.warning(
                "quota backend unavailable (%s, failing %s): %s",
                op,
                "open" if self.fail_open else "closed",
                exc,
            )

    async def _run(self, op: str, script: Any, keys: list[str], args: list[Any]) -> Any:
        """The script's reply, or None after counting a Redis outage (or a Redis error, which must not 500)."""
        try:
            return await self.link.breaker.call(lambda: script(keys=keys, args=args))
        except (BackendUnavailable, redis.RedisError) as exc:
            self._unavailable(op, exc)
            return None

    async def reserve(self, tenant_id: str, tokens: int, limits: QuotaLimits) -> QuotaDecision:
        """Atomically count `tokens` in the tenant's windows in Redis, or in none of them."""
        check_tokens(tokens)
        windows = limits.windows()
        if not windows:
            return unlimited()
        caps = _caps(limits)
        rid = uuid.uuid4().hex
        reply = await self._run(
            "reserve",
            self._reserve,
            self._keys(tenant_id, rid),
            [tokens, *caps, *_SPECS, int(RESERVATION_TTL_S * 1000)],
        )
        if reply is None:
            retry = max(1.0, self.link.breaker.retry_after_s())
            return QuotaDecision(
                self.fail_open,
                0.0 if self.fail_open else retry,
                None,
                None,
                0.0,
                None,
                limits.policy(),
                "backend_unavailable",
            )
        ok = bool(int(reply[0]))
        views = []
        for limit, spec in windows:
            i = 0 if spec == MINUTE else 1
            used, wait, free = int(reply[1 + 3 * i]), float(reply[2 + 3 * i]), float(reply[3 + 3 * i])
            views.append(WindowView(limit, spec.seconds, used, math.inf if wait < 0 else wait, free))
        decision = decide(tokens, views, rid if ok and tokens > 0 else None, limits.policy())
        if decision.allowed != ok:  # the script is the authority; keep the two in step
            decision.allowed = ok
            decision.reservation_id = rid if ok and tokens > 0 else None
        return decision

    async def peek(self, tenant_id: str, limits: QuotaLimits) -> QuotaDecision:
        """The tenant's windows in Redis as they stand, counting nothing; unlimited-looking when Redis is away."""
        windows = limits.windows()
        if not windows:
            return unlimited()
        reply = await self._run("peek", self._peek, self._keys(tenant_id, "-")[:2], [*_caps(limits), *_SPECS])
        if reply is None:
            return QuotaDecision(
                self.fail_open, 0.0, None, None, 0.0, None, limits.policy(), "backend_unavailable"
            )
        views = []
        for limit, spec in windows:
            i = 0 if spec == MINUTE else 1
            views.append(WindowView(limit, spec.seconds, int(reply[2 * i]), 0.0, float(reply[1 + 2 * i])))
        return decide(0, views, None, limits.policy())

    async def settle(
        self, tenant_id: str, reservation_id: str | None, actual_tokens: int, limits: QuotaLimits
    ) -> None:
        """Replace a reservation by the tokens actually used, once; never raises on a Redis outage."""
        check_tokens(actual_tokens)
        if reservation_id is None:
            return
        await self._run(
            "settle", self._settle, self._keys(tenant_id, reservation_id), [actual_tokens, *_SPECS]
        )

    async def close(self) -> None:
        """Close the link if this quota opened it (a shared one is closed by its owner)."""
        if self._owns_link:
            await self.link.close()
