"""Counter sync: one fair share across engines, through Redis, without the engine loop ever waiting on it.

The loop's side is `exchange(policy)`, called at the top of each step: at most once per `interval_s` it
hands a snapshot of this engine's cumulative charged service (fairness/shared.py: weighted, no lifts) to
a daemon thread and wakes it, and it absorbs the merged totals of the other engines when they changed.
Both are reference swaps, so a slow, frozen or dead Redis costs the loop nothing. The thread, with its
own connection, makes ONE pipelined round trip per wake-up: write the snapshot, refresh its TTL and its
membership, list the engines, read every other engine's totals. It also wakes by itself after
`interval_s` without a snapshot (an idle loop: nothing new to write, but the others' totals still come
in and the entry stays alive). A failure is a log line on each change and "stale" in `status()`; the
next exchange that succeeds resyncs everything (totals are cumulative, not deltas).

Woken by the snapshot, the write leaves at most one step after the charges it carries; the read side is
periodic, so a charge reaches another engine's counters within 2·interval_s + RTT + 2 steps (about
interval_s on average): docs/fairness.md, "Across engines".

Layout under the configured prefix P (so tests on a shared Redis never collide):

    P:engines            sorted set, engine id -> last publish (epoch ms); members silent past the TTL pruned
    P:service:<engine>   hash, counter name -> cumulative weighted service (repr float), expires after the TTL

One hash per engine, not one shared hash per tenant: each engine writes only its own key with absolute
values (idempotent, so a lost reply cannot double-count), and a dead engine's entry expires as a whole.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Mapping

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from fairness.shared import RemoteService, SharedCounters

log = logging.getLogger("fairserve.engine.counter_sync")

# An engine's entry outlives its last publish by this much. Long enough that a GC pause, a busy Redis or a
# short outage does not drop a live engine from the others' view; engines that saw it keep its last
# totals anyway (fairness/shared.py), so the TTL only decides when Redis forgets it and new engines no
# longer learn of it.
ENTRY_TTL_S = 10.0
# Each Redis call's deadline. The thread, not the loop, waits this long on a frozen Redis.
REDIS_TIMEOUT_S = 0.5


class RedisExchange:
    """The Redis side: one pipelined round trip per tick (plus one more when new engines appear)."""

    def __init__(self, url: str, prefix: str, engine_id: str) -> None:
        self.engine_id = engine_id
        self._redis = redis.Redis.from_url(
            url,
            socket_timeout=REDIS_TIMEOUT_S,
            socket_connect_timeout=REDIS_TIMEOUT_S,
            retry=Retry(NoBackoff(), 0),
            health_check_interval=0,
            decode_responses=True,
        )
        self._prefix = prefix
        self._members = f"{prefix}:engines"
        self._peers: list[str] = []  # other engines listed at the last exchange

    def _service_key(self, engine_id: str) -> str:
        return f"{self._prefix}:service:{engine_id}"

    def swap(self, local: Mapping[str, float]) -> tuple[dict[str, dict[str, float]], int]:
        """Publish `local`, read the others: (their totals by engine id, engines that published within the TTL)."""
        now_ms = int(time.time() * 1000)
        ttl_ms = int(ENTRY_TTL_S * 1000)
        own = self._service_key(self.engine_id)
        pipe = self._redis.pipeline(transaction=False)
        if local:
            pipe.hset(own, mapping={name: repr(value) for name, value in local.items()})
        pipe.pexpire(own, ttl_ms)
        pipe.zadd(self._members, {self.engine_id: now_ms})
        pipe.zremrangebyscore(self._members, "-inf", now_ms - ttl_ms)
        pipe.zrange(self._members, 0, -1)
        peers = self._peers
        for peer in peers:
            pipe.hgetall(self._service_key(peer))
        replies = pipe.execute()
        members: list[str] = replies[-1 - len(peers)]
        read = dict(zip(peers, replies[len(replies) - len(peers) :], strict=True))
        self._peers = [m for m in members if m != self.engine_id]
        unseen = [m for m in self._peers if m not in read]
        if unseen:  # engines that joined since the last tick: read them now rather than one tick late
            pipe = self._redis.pipeline(transaction=False)
            for peer in unseen:
                pipe.hgetall(self._service_key(peer))
            read.update(zip(unseen, pipe.execute(), strict=True))
        return {peer: _parse(peer, entry) for peer, entry in read.items() if entry}, len(self._peers)

    def close(self) -> None:
        """Drop the connection."""
        self._redis.close()


def _parse(peer: str, entry: Mapping[str, str]) -> dict[str, float]:
    """An engine's hash as floats; a field that is not a finite number >= 0 is skipped (someone else's key)."""
    service: dict[str, float] = {}
    for name, text in entry.items():
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if 0 <= value < float("inf"):
            service[name] = value
        else:
            log.warning("counter sync: engine %s published %r for %r; ignored", peer, text, name)
    return service


class CounterSync:
    """This engine's half of the shared counters: a thread doing the Redis I/O, and `exchange` for the loop."""

    def __init__(self, url: str, interval_s: float, prefix: str, engine_id: str | None = None) -> None:
        self.engine_id = engine_id or uuid.uuid4().hex
        self.interval_s = interval_s
        # "stale" once no exchange succeeded for this long: two ticks and one call's deadline.
        self.stale_after_s = 2 * interval_s + REDIS_TIMEOUT_S
        self._redis = RedisExchange(url, prefix, self.engine_id)
        self._merge = RemoteService()
        self._local: Mapping[str, float] = {}  # the loop's latest snapshot (replaced, never mutated)
        self._offered_at = -float("inf")  # when the loop last handed one over (loop thread only)
        self._offered = threading.Event()  # wakes the thread for a fresh snapshot
        self._latest: tuple[int, dict[str, float]] = (0, {})  # (version, merged totals), swapped whole
        self._absorbed = 0
        self._ok = False
        self._started = time.monotonic()
        self._last_ok: float | None = None
        self._peers = 0
        self.failures = 0  # exchanges that failed since start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fairserve-counter-sync", daemon=True)

    def start(self) -> None:
        """Start the sync thread."""
        self._thread.start()

    def close(self) -> None:
        """Stop the thread (it finishes the exchange in flight, bounded by the Redis timeout) and disconnect."""
        self._stop.set()
        self._offered.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2 * REDIS_TIMEOUT_S + 1.0)
        self._redis.close()

    # -- the loop's side (engine thread) ---------------------------------------------------------
    def exchange(self, policy: SharedCounters) -> None:
        """Hand over a snapshot if asked for one; absorb the others' totals if they changed. Never blocks."""
        now = time.monotonic()
        if now - self._offered_at >= self.interval_s:
            self._offered_at = now
            self._local = dict(policy.local_service())
            self._offered.set()
        version, totals = self._latest
        if version != self._absorbed:
            self._absorbed = version
            policy.absorb_remote(totals)

    def remote_service(self) -> dict[str, float]:
        """The other engines' combined charged service by counter name, as the thread last merged it."""
        return dict(self._latest[1])

    def status(self) -> tuple[str, float, int]:
        """("ok" or "stale", seconds since the last successful exchange, other live engines)."""
        now = time.monotonic()
        age = now - (self._last_ok if self._last_ok is not None else self._started)
        return ("ok" if self._ok and age <= self.stale_after_s else "stale"), age, self._peers

    # -- the thread ------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            self._tick()
            self._offered.wait(self.interval_s)  # a fresh snapshot, or the period without one
            self._offered.clear()

    def _tick(self) -> None:
        local = self._local
        try:
            others, self._peers = self._redis.swap(local)
        except Exception as exc:  # Redis down, frozen, or answering garbage: never let the thread die
            self.failures += 1
            if self._ok or self.failures == 1:
                log.warning(
                    "counter sync: Redis unavailable (%s: %s); this engine goes on with the counters "
                    "it has, and resyncs when Redis answers",
                    type(exc).__name__,
                    exc,
                )
            self._ok = False
            return
        grew = False
        for peer, service in others.items():
            grew = self._merge.observe(peer, service) or grew
        if grew:
            self._latest = (self._latest[0] + 1, self._merge.totals())
        if not self._ok and self.failures:
            log.warning("counter sync: Redis answers again; counters resynced")
        self._ok = True
        self._last_ok = time.monotonic()
