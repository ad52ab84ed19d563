"""Redis idempotency store: `SET NX` + TTL claims shared by gateway replicas.

Keys: `fairserve:idem:<sha256(tenant NUL key)>` holds the record JSON (fingerprint, owner
request id, state, final response); `...:events` is a list of the owner's stream events while it
runs. A follower in another process polls the list from its last offset and the record for
`finished`; the finished record carries every event, so a follower that arrives late loses nothing.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator
from typing import Any

import redis.asyncio as aioredis

from gateway.idempotency import INFLIGHT_LEASE_S, Claim, Followed, StoredResponse


def redis_key(tenant_id: str, key: str) -> str:
    """The record key; hashing keeps client-chosen keys out of the keyspace and scopes them by tenant."""
    digest = hashlib.sha256(f"{tenant_id}\0{key}".encode()).hexdigest()
    return f"fairserve:idem:{digest}"


class RedisIdempotencyStore:
    """Idempotency records in Redis, shared by every gateway process using the same URL."""

    def __init__(self, url: str, ttl_s: float = 86400.0) -> None:
        self.ttl_s = ttl_s
        self._redis: Any = aioredis.from_url(url, decode_responses=True, socket_timeout=5.0)

    async def ping(self) -> bool:
        """True when Redis answers."""
        return bool(await self._redis.ping())

    async def claim(self, tenant_id: str, key: str, fp: str, request_id: str) -> Claim:
        """`SET NX` an in-flight record; on conflict read the winner's record."""
        rkey = redis_key(tenant_id, key)
        record = json.dumps({"fp": fp, "request_id": request_id, "state": "inflight"})
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
        pipe = self._redis.pipeline()
        pipe.rpush(ekey, chunk)
        pipe.pexpire(ekey, int(min(self.ttl_s, INFLIGHT_LEASE_S) * 1000))
        await pipe.execute()

    async def finish(self, tenant_id: str, key: str, response: StoredResponse) -> None:
        """Overwrite the record as finished (only if it still exists) and drop the event list."""
        rkey = redis_key(tenant_id, key)
        raw = await self._redis.get(rkey)
        if raw is None:
            return
        record = json.loads(raw)
        record.update(state="finished", response=response.to_json())
        pipe = self._redis.pipeline()
        pipe.set(rkey, json.dumps(record), xx=True, px=int(self.ttl_s * 1000))
        pipe.delete(rkey + ":events")
        await pipe.execute()

    async def abandon(self, tenant_id: str, key: str) -> None:
        """Delete the record and its events."""
        rkey = redis_key(tenant_id, key)
        await self._redis.delete(rkey, rkey + ":events")

    async def follow(self, tenant_id: str, key: str, poll_s: float = 0.02) -> AsyncIterator[Followed]:
        """Poll the owner's events and record until it finishes or abandons."""
        rkey = redis_key(tenant_id, key)
        sent = 0
        while True:
            raw = await self._redis.get(rkey)
            if raw is None:
                yield Followed([], abandoned=True)
                return
            record = json.loads(raw)
            if record["state"] == "finished":
                yield Followed([], final=StoredResponse.from_json(record["response"]))
                return
            fresh = await self._redis.lrange(rkey + ":events", sent, -1)
            if fresh:
                sent += len(fresh)
                yield Followed(list(fresh))
            await asyncio.sleep(poll_s)

    async def close(self) -> None:
        """Close the connection pool."""
        await self._redis.aclose()
