"""Redis idempotency store: `SET NX` + TTL claims shared by gateway replicas.

Keys: `fairserve:idem:<sha256(tenant NUL key)>` holds the record JSON (fingerprint, owner
request id, state, final response); `...:events` is a list of the owner's stream events while it
runs. A follower in another process polls the list from its last offset and the record for
`finished`; the finished record carries every event, so a follower that arrives late loses nothing.

Every operation goes through the `RedisLink` breaker (short deadline, fail fast while Redis is away).
`claim` raises `BackendUnavailable` (the gateway answers 503 `idempotency_unavailable`: without the
record it cannot promise at-most-once); `append`, `finish` and `abandon` come after the answer was
decided, so they log, count in `fairserve_idempotency_backend_unavailable_total{op}` and carry on (the
in-flight lease then frees the key); a follower whose Redis goes away ends as if the owner had abandoned.

Records an outage left in flight with no owner (a claim that timed out but ran when Redis thawed, a
finish or abandon that could not be written) are put right by gateway/idempotency/repair.py once Redis
answers again, so a retry replays or runs instead of attaching to nobody for the 15-minute lease.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import threading
import time
import uuid
import weakref
from collections import OrderedDict
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, TypeVar

import redis
from prometheus_client import REGISTRY, CollectorRegistry, Counter

from admission.breaker import BackendUnavailable
from admission.redis_link import RedisLink, own_link
from gateway.idempotency.records import INFLIGHT_LEASE_S, Claim, Followed, StoredResponse
from gateway.idempotency.repair import RecordRepair, response_json

log = logging.getLogger(__name__)
T = TypeVar("T")
_OPS = ("claim", "append", "finish", "abandon", "follow")
OWNED_KEPT = 100_000  # far more claims than run at once in one process


def redis_key(tenant_id: str, key: str) -> str:
    """The record key; hashing keeps client-chosen keys out of the keyspace and scopes them by tenant."""
    digest = hashlib.sha256(f"{tenant_id}\0{key}".encode()).hexdigest()
    return f"fairserve:idem:{digest}"


_metrics_lock = threading.Lock()
_metrics: weakref.WeakKeyDictionary[CollectorRegistry, Counter] = weakref.WeakKeyDictionary()


def _unavailable_counter(registry: CollectorRegistry | None) -> Counter:
    registry = REGISTRY if registry is None else registry
    with _metrics_lock:
        found = _metrics.get(registry)
        if found is None:
            found = _metrics[registry] = Counter(
                "fairserve_idempotency_backend_unavailable_total",
                "Idempotency operations that could not reach Redis, by operation "
                "(claim: answered 503 idempotency_unavailable).",
                ["op"],
                registry=registry,
            )
            for op in _OPS:
                found.labels(op=op)  # exported at 0 from the start
        return found


class RedisIdempotencyStore:
    """Idempotency records in Redis, shared by every gateway process using the same URL."""

    def __init__(
        self,
        link: RedisLink | str,
        ttl_s: float,
        registry: CollectorRegistry | None = None,
        timeout_s: float | None = None,
    ) -> None:
        self.ttl_s = ttl_s
        self.link = own_link(link, timeout_s)
        self._owns_link = isinstance(link, str)
        self._redis: Any = self.link.client
        self._unavailable = _unavailable_counter(registry)
        self._last_log = 0.0
        self.repair = RecordRepair(self._redis, self.link.breaker, ttl_s)
        # record key -> nonce of the claims this process runs; bounded, since a request cancelled between its
        # claim and its run never finishes nor abandons (its lease frees the key)
        self._owned: OrderedDict[str, str] = OrderedDict()

    async def _call(self, op: str, fn: Callable[[], Awaitable[T]]) -> T:
        """`fn` under the breaker; an outage (or a Redis error, which must not 500) is counted and raised."""
        try:
            return await self.link.breaker.call(fn)
        except redis.RedisError as exc:
            self._unavailable.labels(op=op).inc()
            raise BackendUnavailable("redis", 1.0, type(exc).__name__) from exc
        except BackendUnavailable:
            self._unavailable.labels(op=op).inc()
            raise

    async def _best_effort(self, op: str, fn: Callable[[], Awaitable[Any]]) -> bool:
        """Run `fn`; False (logged, counted) when Redis is away: the answer was already decided."""
        try:
            await self._call(op, fn)
        except BackendUnavailable as exc:
            now = time.monotonic()
            if now - self._last_log > 5.0:  # at request rate, one line every few seconds is enough
                self._last_log = now
                log.warning("idempotency %s skipped: %s", op, exc)
            return False
        return True

    async def ping(self) -> bool:
        """True when Redis answers (bounded by the breaker's timeout; False at once while it is open)."""
        return await self.link.breaker.check()

    async def claim(self, tenant_id: str, key: str, fp: str, request_id: str) -> Claim:
        """`SET NX` an in-flight record; on conflict read the winner's record. Raises `BackendUnavailable`."""
        nonce = uuid.uuid4().hex
        rkey = redis_key(tenant_id, key)
        try:
            claim = await self._call("claim", lambda: self._claim(tenant_id, key, fp, request_id, nonce))
        except BackendUnavailable as exc:
            if (
                exc.__cause__ is not None
            ):  # it reached Redis (not failed fast): the SET NX may still run there
                self.repair.later(rkey, nonce)
            raise
        if claim.outcome == "new":
            self._owned[rkey] = nonce
            if len(self._owned) > OWNED_KEPT:
                self._owned.popitem(last=False)
        return claim

    async def _claim(self, tenant_id: str, key: str, fp: str, request_id: str, nonce: str) -> Claim:
        rkey = redis_key(tenant_id, key)
        record = json.dumps({"fp": fp, "request_id": request_id, "state": "inflight", "nonce": nonce})
        lease_ms = int(min(self.ttl_s, INFLIGHT_LEASE_S) * 1000)
        for _ in range(3):
            if await self._redis.set(rkey, record, nx=True, px=lease_ms):
                await self._redis.delete(rkey + ":events")
                return Claim("new", request_id)
            raw = await self._redis.get(rkey)
            if raw is None:  # expired or abandoned between SET and GET: try again
                continue
            existing = json.loads(raw)
            if existing["fp"] != fp:
                return Claim("mismatch", existing["request_id"])
            if existing["state"] == "finished":
                return Claim("replay", existing["request_id"], StoredResponse.from_json(existing["response"]))
            return Claim("attach", existing["request_id"])
        raise RuntimeError("idempotency record kept vanishing while being claimed")

    async def append(self, tenant_id: str, key: str, chunk: str) -> None:
        """RPUSH one event, expiring with the in-flight lease."""
        ekey = redis_key(tenant_id, key) + ":events"

        async def push() -> None:
            pipe = self._redis.pipeline()
            pipe.rpush(ekey, chunk)
            pipe.pexpire(ekey, int(min(self.ttl_s, INFLIGHT_LEASE_S) * 1000))
            await pipe.execute()

        await self._best_effort("append", push)

    async def finish(self, tenant_id: str, key: str, response: StoredResponse) -> None:
        """Mark this process's claim finished with the response (kept for the TTL), and drop the event list."""
        rkey = redis_key(tenant_id, key)
        nonce = self._owned.pop(rkey, None)
        if nonce is None:  # not claimed through this store: finish whatever record is there
            await self._best_effort("finish", lambda: self._finish_any(rkey, response))
            return
        body = response_json(response)
        if not await self._best_effort("finish", lambda: self.repair.finish(rkey, nonce, body)):
            self.repair.later(rkey, nonce, body)  # a retry must replay it, not run it twice

    async def abandon(self, tenant_id: str, key: str) -> None:
        """Delete this process's claim and its events, so a retry runs afresh."""
        rkey = redis_key(tenant_id, key)
        nonce = self._owned.pop(rkey, None)
        if nonce is None:  # not claimed through this store: delete whatever record is there
            await self._best_effort("abandon", lambda: self._redis.delete(rkey, rkey + ":events"))
            return
        if not await self._best_effort("abandon", lambda: self.repair.release(rkey, nonce)):
            self.repair.later(rkey, nonce)

    async def _finish_any(self, rkey: str, response: StoredResponse) -> None:
        raw = await self._redis.get(rkey)
        if raw is None:
            return
        record = json.loads(raw)
        record.update(state="finished", response=response.to_json())
        pipe = self._redis.pipeline()
        pipe.set(rkey, json.dumps(record), xx=True, px=int(self.ttl_s * 1000))
        pipe.delete(rkey + ":events")
        await pipe.execute()

    async def follow(self, tenant_id: str, key: str, poll_s: float = 0.02) -> AsyncGenerator[Followed, None]:
        """Poll the owner's events and record until it finishes or abandons (or Redis goes away)."""
        rkey = redis_key(tenant_id, key)
        sent = 0
        while True:
            try:
                raw = await self._call("follow", lambda: self._redis.get(rkey))
                record = json.loads(raw) if raw is not None else None
                fresh: list[bytes] = []
                if record is not None and record["state"] != "finished":
                    fresh = await self._call("follow", self._events_from(rkey, sent))
            except BackendUnavailable:
                record = None
            if record is None:
                yield Followed([], abandoned=True)
                return
            if record["state"] == "finished":
                yield Followed([], final=StoredResponse.from_json(record["response"]))
                return
            if fresh:
                sent += len(fresh)
                yield Followed([c.decode() for c in fresh])
            await asyncio.sleep(poll_s)

    def _events_from(self, rkey: str, offset: int) -> Callable[[], Awaitable[list[bytes]]]:
        return lambda: self._redis.lrange(rkey + ":events", offset, -1)

    async def close(self) -> None:
        """Stop the clean-up and close the link if this store opened it (a shared one is closed by its owner)."""
        await self.repair.close()
        if self._owns_link:
            await self.link.close()
