"""Idempotency records: tenant-scoped keys, body fingerprints, in-flight and finished states.

A record is claimed atomically by the first request with a key. While the owner runs, retries
attach to it; once finished, the record holds the whole response (for a stream, every event)
and retries replay it without engine work. The in-process side of attaching is `gateway.openai.runs`;
this module stores what other processes need to see. See docs/gateway.md for the full design.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import AsyncGenerator
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol

INFLIGHT_LEASE_S = 900.0  # an in-flight record outlives no request; a crashed owner frees the key


def fingerprint(path: str, body: Any) -> str:
    """sha256 of the endpoint and the canonical JSON of the parsed body (key order and spacing ignored)."""
    canonical = json.dumps(
        {"path": path, "body": body}, sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass
class StoredResponse:
    """A finished response as replayed: status, the headers worth keeping, and its body chunks.

    `kind="json"` has one chunk, the body; `kind="sse"` has one chunk per server-sent event.
    """

    status: int
    kind: Literal["json", "sse"]
    chunks: list[str]
    headers: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict."""
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> StoredResponse:
        """Inverse of to_json."""
        return cls(
            status=raw["status"], kind=raw["kind"], chunks=list(raw["chunks"]), headers=dict(raw["headers"])
        )


@dataclass
class Claim:
    """The outcome of claiming a key: run it (`new`), `replay`, `attach` to the owner, or `mismatch`."""

    outcome: Literal["new", "replay", "attach", "mismatch"]
    request_id: str | None = None  # the owner's request id (attach, replay)
    response: StoredResponse | None = None  # replay only


@dataclass
class Followed:
    """What a remote follower sees: new chunks, and the final response once the owner finishes."""

    chunks: list[str]
    final: StoredResponse | None = None
    abandoned: bool = False


class IdempotencyStore(Protocol):
    """Where idempotency records live: memory for one process, Redis for replicas."""

    async def claim(self, tenant_id: str, key: str, fp: str, request_id: str) -> Claim:
        """Atomically create an in-flight record, or report the existing one."""

    async def append(self, tenant_id: str, key: str, chunk: str) -> None:
        """Publish one stream event of the owner, for followers in other processes."""

    async def finish(self, tenant_id: str, key: str, response: StoredResponse) -> None:
        """Mark the record finished with the full response, kept for the TTL."""

    async def abandon(self, tenant_id: str, key: str) -> None:
        """Drop the record: the owner ended without a response worth replaying."""

    def follow(self, tenant_id: str, key: str, poll_s: float = 0.02) -> AsyncGenerator[Followed, None]:
        """Chunks of an owner running elsewhere, until it finishes or abandons."""

    async def close(self) -> None:
        """Release connections."""


@dataclass
class _Record:
    fp: str
    request_id: str
    expires: float
    final: StoredResponse | None = None
    chunks: list[str] = field(default_factory=list)


class MemoryIdempotencyStore:
    """Single-process store; followers in the same process read the run directly, so follow is trivial."""

    def __init__(self, ttl_s: float, clock: Any = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self._records: dict[tuple[str, str], _Record] = {}
        self._lock = asyncio.Lock()

    def _live(self, scope: tuple[str, str]) -> _Record | None:
        rec = self._records.get(scope)
        if rec is not None and rec.expires <= self._clock():
            del self._records[scope]
            return None
        return rec

    async def claim(self, tenant_id: str, key: str, fp: str, request_id: str) -> Claim:
        """Atomically create an in-flight record, or report the existing one."""
        scope = (tenant_id, key)
        async with self._lock:
            self._expire()
            rec = self._live(scope)
            if rec is None:
                lease = min(self.ttl_s, INFLIGHT_LEASE_S)
                self._records[scope] = _Record(fp, request_id, self._clock() + lease)
                return Claim("new", request_id)
            if rec.fp != fp:
                return Claim("mismatch", rec.request_id)
            if rec.final is not None:
                return Claim("replay", rec.request_id, rec.final)
            return Claim("attach", rec.request_id)

    def _expire(self) -> None:
        now = self._clock()
        for scope in [s for s, r in self._records.items() if r.expires <= now]:
            del self._records[scope]

    async def append(self, tenant_id: str, key: str, chunk: str) -> None:
        """Publish one stream event (kept so a follower can read from the start)."""
        rec = self._live((tenant_id, key))
        if rec is not None:
            rec.chunks.append(chunk)

    async def finish(self, tenant_id: str, key: str, response: StoredResponse) -> None:
        """Mark finished; the record lives for the TTL from now."""
        rec = self._live((tenant_id, key))
        if rec is not None:
            rec.final = response
            rec.chunks = []
            rec.expires = self._clock() + self.ttl_s

    async def abandon(self, tenant_id: str, key: str) -> None:
        """Drop the record."""
        self._records.pop((tenant_id, key), None)

    async def follow(self, tenant_id: str, key: str, poll_s: float = 0.02) -> AsyncGenerator[Followed, None]:
        """Poll the record (used only when the owning run is not registered in this process)."""
        sent = 0
        while True:
            rec = self._live((tenant_id, key))
            if rec is None:
                yield Followed([], abandoned=True)
                return
            if rec.final is not None:
                yield Followed([], final=rec.final)
                return
            if len(rec.chunks) > sent:
                yield Followed(rec.chunks[sent:])
                sent = len(rec.chunks)
            await asyncio.sleep(poll_s)

    async def close(self) -> None:
        """Nothing to release."""


def make_idempotency_store(redis: Any, ttl_s: float, registry: Any = None) -> IdempotencyStore:
    """Redis store over a `RedisLink` (or URL) when one is given, else the in-memory one."""
    if redis:
        from gateway.idempotency.redis_store import RedisIdempotencyStore

        return RedisIdempotencyStore(redis, ttl_s, registry=registry)
    return MemoryIdempotencyStore(ttl_s)
