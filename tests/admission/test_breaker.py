"""The Redis circuit breaker against a real, private redis-server: a frozen server costs one timeout, then calls
fail fast; the background probe backs off while it stays frozen and closes the breaker once it answers."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from admission.breaker import BackendUnavailable
from admission.redis_link import connect
from tests.billing.services import private_redis
from tests.redis_server import RedisServer


@pytest.fixture()
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    yield from private_redis(tmp_path / "redis")


def test_frozen_redis_opens_the_breaker_and_the_probe_closes_it(redis_server: RedisServer) -> None:
    registry = CollectorRegistry()

    async def scenario() -> None:
        link = connect(redis_server.url, timeout_s=0.2, registry=registry)
        breaker = link.breaker
        try:
            assert await breaker.call(lambda: link.client.set("k", "v")) is True
            assert not breaker.is_open and breaker.snapshot() == {"state": "closed", "trips": 0}
            redis_server.freeze()
            with pytest.raises(BackendUnavailable) as timed_out:
                await breaker.call(lambda: link.client.get("k"))
            assert timed_out.value.__cause__ is not None  # it reached the socket and waited out the deadline
            assert breaker.is_open
            for _ in range(50):  # open: every call fails at once, none reaches the socket
                with pytest.raises(BackendUnavailable) as fast:
                    await breaker.call(lambda: link.client.get("k"))
                assert fast.value.__cause__ is None and "circuit open" in str(fast.value)
            assert not await breaker.check()  # /readyz never waits while open
            snap = breaker.snapshot()
            assert snap["state"] == "open" and snap["trips"] == 1 and snap["last_error"] == "TimeoutError"
            assert registry.get_sample_value("fairserve_backend_circuit_open", {"backend": "redis"}) == 1
            redis_server.thaw()
            await asyncio.wait_for(breaker.wait_closed(), 30)
            assert not breaker.is_open
            assert await breaker.call(lambda: link.client.get("k")) == b"v"
            assert registry.get_sample_value("fairserve_backend_circuit_open", {"backend": "redis"}) == 0
            assert (
                registry.get_sample_value("fairserve_backend_circuit_trips_total", {"backend": "redis"}) == 1
            )
        finally:
            if redis_server.frozen:
                redis_server.thaw()
            await link.close()

    asyncio.run(scenario())


def test_killed_redis_fails_fast_and_reconnects_after_restart(redis_server: RedisServer) -> None:
    async def scenario() -> None:
        link = connect(redis_server.url, timeout_s=0.2)
        try:
            assert await link.breaker.check()
            redis_server.kill()
            with pytest.raises(BackendUnavailable):
                await link.breaker.call(lambda: link.client.ping())
            assert link.breaker.snapshot()["last_error"] == "ConnectionError"
            redis_server.start()
            await asyncio.wait_for(link.breaker.wait_closed(), 30)
            assert await link.breaker.check()
        finally:
            await link.close()

    asyncio.run(scenario())
