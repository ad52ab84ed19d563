"""Authentication failures are cheap and rate-limited per client address (real HTTP, real SQLite)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from billing.keys import generate_secret
from engine import AsyncEngine
from gateway.edge.auth_guard import FailureBudget
from gateway.settings import GatewaySettings
from tests.gateway.conftest import Server, start_server, wait_for


@pytest.fixture()
def guarded(engine: AsyncEngine, tmp_path: Path) -> Iterator[Server]:
    """A gateway whose addresses may fail 5 times at once, then once per 10 s; keys cached for 2 s."""
    settings = GatewaySettings(
        data_dir=tmp_path,
        port=0,
        engine=engine.config,
        auth_failure_burst=5,
        auth_failure_rate_per_s=0.1,
        key_cache_ttl_s=2.0,
    )
    srv = start_server(settings, engine)
    srv.add_tenant("payer")
    yield srv
    srv.stop()


def test_failure_budget_gives_429_and_cached_keys_still_pass(guarded: Server) -> None:
    lookups: list[bool] = []
    real = guarded.state.store.verify_key

    def spy(secret: str):  # type: ignore[no-untyped-def]
        try:
            asyncio.get_running_loop()
            lookups.append(True)  # on the event loop: what must not happen
        except RuntimeError:
            lookups.append(False)
        return real(secret)

    guarded.state.store.verify_key = spy  # type: ignore[method-assign]
    with httpx.Client(base_url=guarded.url, timeout=30) as c:
        assert c.get("/v1/models", headers=guarded.headers("payer")).status_code == 200  # now cached
        bad = {"Authorization": f"Bearer {generate_secret()}"}
        codes = [c.get("/v1/models", headers=bad).status_code for _ in range(3)]
        assert codes == [401, 401, 401]
        assert len(lookups) == 2  # the payer's key and the bad key once: the repeat was cached negatively
        for _ in range(2):
            assert (
                c.get("/v1/models", headers={"Authorization": f"Bearer {generate_secret()}"}).status_code
                == 401
            )
        assert c.get("/v1/models").status_code == 429  # budget spent: even a missing key is refused
        limited = c.get("/v1/models", headers={"Authorization": f"Bearer {generate_secret()}"})
        assert limited.status_code == 429 and limited.json()["error"]["code"] == "too_many_auth_failures"
        assert 1 <= int(limited.headers["retry-after"]) <= 10
        assert len(lookups) == 4  # no lookup once the address is over its budget
        assert c.get("/v1/models", headers=guarded.headers("payer")).status_code == 200  # cached: served
        keys = guarded.state.keys
        wait_for(lambda: not keys.peek(guarded.keys["payer"])[0], 10, "the payer's cache entry expired")
        looked = len(lookups)
        assert c.get("/v1/models", headers=guarded.headers("payer")).status_code == 200  # refreshed, not 429
        assert len(lookups) == looked + 1
    assert not any(lookups), "a key lookup ran on the event loop"
    text = httpx.get(
        guarded.url + "/metrics", headers={"Authorization": f"Bearer {guarded.state.metrics_token}"}
    ).text
    assert 'fairserve_auth_failures_total{outcome="invalid"} 5.0' in text
    assert (
        'outcome="missing"' not in text
    )  # the request without a key came when the budget was spent: limited
    assert 'fairserve_auth_failures_total{outcome="limited"} 2.0' in text


def test_budget_refills_and_is_per_address() -> None:
    budget = FailureBudget(burst=2, rate_per_s=1000.0)
    budget.charge("a")
    budget.charge("a")
    assert budget.retry_after("b") is None
    wait_for(lambda: budget.retry_after("a") is None, 5, "the bucket refilled")
    slow = FailureBudget(burst=2, rate_per_s=0.5, max_addresses=2)
    for _ in range(2):
        slow.charge("a")
    assert slow.retry_after("a") == 2
    slow.charge("b")
    slow.charge("c")  # the LRU bound drops "a"
    assert slow.retry_after("a") is None


def test_a_key_that_ignores_its_retry_after_is_held(monkeypatch: pytest.MonkeyPatch) -> None:
    """`refused`: more than `hold_after` refusals inside one Retry-After window hold the key for `hold_s`;
    loops that each wait their Retry-After send one a window and are never held. A clock of the test's
    own, so the windows are exact."""
    now = [1000.0]
    monkeypatch.setattr("gateway.edge.auth_guard.time.monotonic", lambda: now[0])
    budget = FailureBudget(burst=1, rate_per_s=0.5, hold_after=3, hold_s=50.0)
    budget.charge("patient")
    for _ in range(10):  # three loops of "patient", each waiting what it was told: three refusals a window
        waits = []
        for _ in range(3):
            wait = budget.retry_after("patient")
            assert wait is not None
            waits.append(budget.refused("patient", wait))
        assert waits == [2, 2, 2] and not budget.held("patient")
        now[0] += 2.0
        budget.charge("patient")  # served once the window is over, and spent again
    budget.charge("ignorer")
    told = [budget.refused("ignorer", budget.retry_after("ignorer") or 0) for _ in range(5)]
    assert told[:4] == [2, 2, 2, 2] and told[4] == 50  # the fourth ignored refusal starts the hold
    assert budget.held("ignorer") and not budget.held("patient")
    now[0] += 10.0  # the bucket has refilled; the hold has not ended
    assert budget.retry_after("ignorer") == 40
    now[0] += 41.0
    assert budget.retry_after("ignorer") is None and not budget.held("ignorer")
    with pytest.raises(ValueError):
        FailureBudget(hold_after=2, hold_s=0.0)
