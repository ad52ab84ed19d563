"""Idempotency records this process had to leave wrong while Redis was away, put right once it answers.

Three ways a Redis outage leaves an in-flight record that no one will ever finish, to which a retry with
the same key would attach and then wait out the 15-minute lease:

* a claim that timed out against a frozen Redis, which runs its `SET NX` when it thaws;
* a `finish` that could not be written (the response was sent, its record stayed in flight);
* an `abandon` that could not be written.

Each claim writes a nonce into its record. The store hands such cases here; once the breaker has closed,
a task writes the finished response (so a retry replays it instead of running twice) or deletes the
record, each by a compare-and-set script that acts only while the record is still in flight under this
claim's nonce, so a record someone else claimed since is never touched. Memory is bounded: at most
`MAX_PENDING` records and `MAX_PENDING_BYTES` of responses wait; past that the oldest are dropped and the
lease frees their keys as before.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict
from functools import partial
from typing import Any

import redis

from admission.breaker import BackendUnavailable, CircuitBreaker

log = logging.getLogger(__name__)
MAX_PENDING = 10_000
MAX_PENDING_BYTES = 64 << 20

# KEYS: record, its events. ARGV: nonce. Delete the record only if this claim left it in flight.
_RELEASE_LUA = """
local raw = redis.call('GET', KEYS[1])
if not raw then return 0 end
local rec = cjson.decode(raw)
if rec['state'] ~= 'inflight' or rec['nonce'] ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1], KEYS[2])
return 1
"""

# KEYS: record, its events. ARGV: nonce, response JSON, ttl ms. Finish the record only if it is still this
# claim's and in flight (an owner whose lease ran out must not overwrite the next claimant's record).
_FINISH_LUA = """
local raw = redis.call('GET', KEYS[1])
if not raw then return 0 end
local rec = cjson.decode(raw)
if rec['state'] ~= 'inflight' or rec['nonce'] ~= ARGV[1] then return 0 end
rec['state'] = 'finished'
rec['response'] = cjson.decode(ARGV[2])
redis.call('SET', KEYS[1], cjson.encode(rec), 'PX', ARGV[3])
redis.call('DEL', KEYS[2])
return 1
"""


class RecordRepair:
    """The finishing and releasing scripts, and the records waiting for Redis to come back."""

    def __init__(self, client: Any, breaker: CircuitBreaker, ttl_s: float) -> None:
        self._breaker = breaker
        self._ttl_ms = int(ttl_s * 1000)
        self._release = client.register_script(_RELEASE_LUA)
        self._finish = client.register_script(_FINISH_LUA)
        self._pending: OrderedDict[str, tuple[str, str | None]] = OrderedDict()  # rkey -> (nonce, response)
        self._pending_bytes = 0
        self._task: asyncio.Task[None] | None = None

    async def finish(self, rkey: str, nonce: str, response_json: str) -> Any:
        """Write the finished record now (one script call; the caller runs it under the breaker)."""
        return await self._finish(keys=[rkey, rkey + ":events"], args=[nonce, response_json, self._ttl_ms])

    async def release(self, rkey: str, nonce: str) -> Any:
        """Delete the record now if this claim still holds it in flight."""
        return await self._release(keys=[rkey, rkey + ":events"], args=[nonce])

    def later(self, rkey: str, nonce: str, response_json: str | None = None) -> None:
        """Finish (with a response) or release (without) once Redis answers again."""
        self._forget(rkey)
        self._pending[rkey] = (nonce, response_json)
        self._pending_bytes += len(response_json or "")
        while len(self._pending) > MAX_PENDING or self._pending_bytes > MAX_PENDING_BYTES:
            self._forget(next(iter(self._pending)))
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._drain())

    def pending(self) -> int:
        """Records waiting for Redis."""
        return len(self._pending)

    def _forget(self, rkey: str) -> None:
        entry = self._pending.pop(rkey, None)
        if entry is not None:
            self._pending_bytes -= len(entry[1] or "")

    async def _drain(self) -> None:
        while self._pending:
            await self._breaker.wait_closed()
            rkey, (nonce, response_json) = next(iter(self._pending.items()))
            try:
                if response_json is None:
                    await self._breaker.call(partial(self.release, rkey, nonce))
                else:
                    await self._breaker.call(partial(self.finish, rkey, nonce, response_json))
            except BackendUnavailable:
                continue  # the breaker opened again: wait for it to close
            except redis.RedisError:
                log.warning("could not repair idempotency record %s", rkey, exc_info=True)
            self._forget(rkey)

    async def close(self) -> None:
        """Stop waiting (shutdown): what is left is freed by the lease."""
        if self._task is not None:
            self._task.cancel()


def response_json(response: Any) -> str:
    """The stored response as the finishing script takes it."""
    return json.dumps(response.to_json())
