"""One Redis for the edge: an asyncio client with short timeouts and no hidden retries, behind a breaker.

Quotas and idempotency records share it, so when one of them finds Redis dead or frozen the other stops
calling it too. redis-py would by default retry a failed command three times with back-off, turning a
250 ms timeout into seconds; here a failure is reported at once and the breaker decides what happens next.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from admission.breaker import CircuitBreaker, breaker_metrics

# What says "the server is not there" (as opposed to a script or type error, which is a bug).
REDIS_DOWN: tuple[type[BaseException], ...] = (redis.ConnectionError, redis.TimeoutError, OSError)


@dataclass
class RedisLink:
    """The shared client and its breaker."""

    client: Any  # redis.asyncio.Redis (bytes responses)
    breaker: CircuitBreaker

    async def close(self) -> None:
        """Stop the probe and close the connection pool."""
        await self.breaker.close()
        await self.client.aclose()


def connect(
    url: str, timeout_s: float, registry: CollectorRegistry | None = None, backoff_max_s: float = 30.0
) -> RedisLink:
    """A client for `url` (connects lazily) whose every call the breaker bounds by `timeout_s`.

    With a registry, the breaker's state is exported as `fairserve_backend_circuit_*{backend="redis"}`.
    """
    on_change = breaker_metrics(registry, "redis") if registry is not None else None
    client = aioredis.from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), 0),
        health_check_interval=0,
    )

    async def drop_idle() -> None:
        # Idle pooled connections may be dead (a restarted server): drop them before each recovery probe, so
        # that neither the probe nor the first calls after the breaker closes fail on a stale socket.
        await client.connection_pool.disconnect(inuse_connections=False)

    breaker = CircuitBreaker(
        "redis",
        client.ping,
        timeout_s=timeout_s,
        failures=REDIS_DOWN,
        backoff_max_s=backoff_max_s,
        on_change=on_change,
        before_probe=drop_idle,
    )
    return RedisLink(client, breaker)


def own_link(link: RedisLink | str, timeout_s: float | None) -> RedisLink:
    """`link` itself, or a new one to the URL `link` bounded by `timeout_s` (which a URL needs)."""
    if not isinstance(link, str):
        return link
    if timeout_s is None:
        raise ValueError("a Redis URL needs timeout_s (the settings tree's redis_timeout_s)")
    return connect(link, timeout_s)
