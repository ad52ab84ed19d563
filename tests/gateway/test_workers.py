"""Issue 47, points 2-3: `fairserve serve --workers 2` in front of one `fairserve engine`, over real HTTP.

The two workers must behave as two separate gateways do (tests/gateway/test_scale_out.py): one fair share,
idempotency, quotas and key revocation through Redis, one ledger. A test reaches a given worker by its
connection: the kernel places each new connection on one worker's accept queue (SO_REUSEPORT) and keep-alive
keeps it there, so `pinned()` opens connections until /healthz has answered from both pids.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from functools import partial

import httpx
import pytest

from billing import BillingStore, Database
from gateway.edge.key_events import publish_change
from tests.billing.conftest import pg_url  # noqa: F401  (the fixture: the ledger both workers write)
from tests.billing.services import require
from tests.engine.serving.remote.engine_process import EngineProcess
from tests.gateway.conftest import wait_for
from tests.gateway.serve_process import ServeProcess
from tests.gateway.test_scale_out import ClosedLoop, ledger_service, short_prompt

REDIS_URL = "redis://127.0.0.1:6379/13"  # a db of its own: the idempotency and quota keys of this module
MAX_SEQS = 8  # issue 54 point 7: the engine's seats when 3:1 read 2.16 over 20 s
WINDOW_S = 45.0  # the fairness window, opened as the tenants' first requests go out
SEEN_PIDS: set[int] = set()  # every worker pid /healthz named: none may outlive the supervisor
CONNECT_TRIES = 64  # new connections tried before giving up on reaching the other worker


@dataclass
class Workers:
    db_url: str
    serve: ServeProcess
    engine: EngineProcess
    model: str

    def tenant(self, weight: float = 1.0, tokens_per_minute: int | None = None) -> tuple[str, str, str]:
        """A new tenant: (API key, key id, tenant id)."""
        db = Database(self.db_url)
        try:
            store = BillingStore(db)
            tenant_id = store.create_tenant(
                f"workers-{uuid.uuid4().hex[:8]}", weight=weight, tokens_per_minute=tokens_per_minute
            ).id
            secret, info = store.create_key(tenant_id)
            return secret, info.id, tenant_id
        finally:
            db.dispose()

    def pinned(self) -> tuple[httpx.Client, httpx.Client]:
        """Two keep-alive clients whose connections reached different workers."""
        first = httpx.Client(base_url=self.serve.url, timeout=60)
        pid = pid_of(first)
        for _ in range(CONNECT_TRIES):
            other = httpx.Client(base_url=self.serve.url, timeout=60)
            if pid_of(other) != pid:
                return first, other
            other.close()
        first.close()
        raise AssertionError(f"{CONNECT_TRIES} connections all reached worker {pid}")

    def body(self, **extra: object) -> dict[str, object]:
        return {"model": self.model, "prompt": "count to ten", "max_tokens": 8, "ignore_eos": True, **extra}


def pid_of(client: httpx.Client) -> int:
    """The pid of the worker behind the client's (kept-alive) connection."""
    resp = client.get("/healthz")
    assert resp.status_code == 200, resp.text
    SEEN_PIDS.add(int(resp.json()["pid"]))
    return int(resp.json()["pid"])


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def refused(client: httpx.Client, key: str) -> bool:
    return client.get("/v1/models", headers=auth(key)).status_code == 401


def auth(key: str, **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", **extra}


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory, pg_url: str) -> Iterator[Workers]:  # noqa: F811
    require("127.0.0.1", 6379, "Redis")
    tmp = tmp_path_factory.mktemp("workers")
    engine = EngineProcess(tmp / "engine", "--num-kv-blocks", "512", "--max-num-seqs", str(MAX_SEQS))
    try:
        serve = ServeProcess(
            tmp / "gateway",
            "--workers",
            "2",
            "--db",
            pg_url,
            "--redis",
            REDIS_URL,
            "--redis-timeout",
            "2",
            "--engine",
            engine.address,
        )
        try:
            key = serve.banner["api_key"]
            model = httpx.get(f"{serve.url}/v1/models", headers=auth(key), timeout=10).json()["data"][0]["id"]
            yield Workers(pg_url, serve, engine, model)
        finally:
            serve.terminate()
            code = serve.wait(60)
            serve.stop()
        assert code == 0, "".join(serve.output[-20:])
        assert SEEN_PIDS and not [pid for pid in SEEN_PIDS if alive(pid)], "a worker outlived SIGTERM"
    finally:
        engine.kill()


def test_weights_3_to_1_hold_through_two_workers(workers: Workers) -> None:
    """Charged service from the ledger (test_scale_out.py) over the first WINDOW_S seconds, the start-up
    transient included: issue 54 point 7 read 2.16 over 20 s and 2.63 over 45 s at 8 seats. Both tenants
    keep 16 requests live (test_scale_out.CLIENTS), 2x the engine's seats, so each is backlogged throughout (a tenant with
    fewer requests live than its share of seats is demand-limited, and then VTC rightly gives its idle
    seats away: docs/fairness.md)."""
    (key_a, _, _), (key_b, _, _) = workers.tenant(3.0), workers.tenant(1.0)
    t0 = time.monotonic()
    a = ClosedLoop(workers.serve.url, key_a, workers.model, short_prompt)
    b = ClosedLoop(workers.serve.url, key_b, workers.model, short_prompt)
    try:
        wait_for(lambda: time.monotonic() - t0 >= WINDOW_S, WINDOW_S + 60, "the window's end")
        t1 = time.monotonic()
    finally:
        a.finish()
        b.finish()
    service_a = ledger_service(workers.db_url, a.between(t0, t1))
    service_b = ledger_service(workers.db_url, b.between(t0, t1))
    ratio = service_a / service_b
    print(f"\n  two workers, {MAX_SEQS} seats, weights 3:1 over the first {t1 - t0:.0f} s: A:B = {ratio:.3f}")
    assert len(b.between(t0, t1)) >= 50, "too few answers for a ratio"
    assert abs(ratio / 3.0 - 1) <= 0.10, f"A:B = {ratio:.3f}, want 3 within 10%"


def test_an_idempotent_retry_through_the_other_worker_replays(workers: Workers) -> None:
    key, _, _ = workers.tenant()
    one, two = workers.pinned()
    with closing(one), closing(two):
        pids = (pid_of(one), pid_of(two))
        headers = auth(key, **{"Idempotency-Key": uuid.uuid4().hex})
        first = one.post("/v1/completions", json=workers.body(), headers=headers)
        retry = two.post("/v1/completions", json=workers.body(), headers=headers)
        assert (pid_of(one), pid_of(two)) == pids, "a connection moved to another worker"
    assert first.status_code == 200 and retry.status_code == 200, (first.text, retry.text)
    assert retry.headers.get("idempotent-replayed") == "true", dict(retry.headers)
    assert retry.json() == first.json()


def test_a_quota_spans_the_workers(workers: Workers) -> None:
    """600 tokens a minute, requests of 8 output tokens alternating over both workers: per-worker quotas would
    admit about twice the limit; a shared one refuses on both once the tenant's tokens are spent."""
    limit = 600
    key, _, _ = workers.tenant(tokens_per_minute=limit)
    one, two = workers.pinned()
    admitted: list[int] = []
    refused_by: set[int] = set()
    with closing(one), closing(two):
        for i in range(4 * limit // 8):
            client = (one, two)[i % 2]
            resp = client.post("/v1/completions", json=workers.body(), headers=auth(key))
            if resp.status_code == 429:
                refused_by.add(i % 2)
                if refused_by == {0, 1}:
                    break
                continue
            assert resp.status_code == 200, resp.text
            admitted.append(resp.json()["usage"]["total_tokens"])
    assert refused_by == {0, 1}, "the quota never refused on both workers"
    assert sum(admitted) <= limit, f"{sum(admitted)} tokens admitted under a {limit}-token quota"
    assert sum(admitted) > limit // 2, "the workers refused before the tenant's quota was spent"


def test_a_revoked_key_stops_on_both_workers_within_a_second(workers: Workers) -> None:
    key, key_id, tenant_id = workers.tenant()
    one, two = workers.pinned()
    with closing(one), closing(two):
        for client in (one, two):  # both have the key cached
            assert client.post("/v1/completions", json=workers.body(), headers=auth(key)).status_code == 200
        db = Database(workers.db_url)
        try:
            BillingStore(db).revoke_key(key_id)
        finally:
            db.dispose()
        assert publish_change(REDIS_URL, tenant_id)
        for client in (one, two):
            wait_for(partial(refused, client, key), 1.0, "the revoked key refused")


def test_killing_one_worker_loses_no_answered_row_and_the_other_serves(workers: Workers) -> None:
    (key_a, _, _), (key_b, _, _) = workers.tenant(), workers.tenant()
    loads = [
        ClosedLoop(workers.serve.url, k, workers.model, short_prompt, clients=6, stream_share=0.5)
        for k in (key_a, key_b)
    ]
    one, two = workers.pinned()
    with closing(one), closing(two):
        victim, survivor = pid_of(one), pid_of(two)
        try:
            wait_for(lambda: all(load.count() >= 10 for load in loads), 120, "answers before the kill")
            os.kill(victim, signal.SIGKILL)
            killed = time.monotonic()
            assert pid_of(two) == survivor
            wait_for(lambda: all(load.count(killed) >= 10 for load in loads), 60, "answers after the kill")
        finally:
            for load in loads:
                load.finish()
        assert pid_of(two) == survivor, "the survivor was restarted too"
    answered = set().union(*(set(load.answered) for load in loads))
    ledger_service(workers.db_url, answered)  # fails unless every answered request is billed

    # The supervisor starts a replacement on the same port: some new connection reaches a pid that is neither.
    def replaced() -> bool:
        with httpx.Client(base_url=workers.serve.url, timeout=10) as c:
            try:
                return pid_of(c) not in (victim, survivor)
            except httpx.HTTPError:
                return False

    wait_for(replaced, 120, "a replacement worker")
