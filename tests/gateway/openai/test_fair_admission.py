"""Fair admission over real HTTP on the real engine: a tenant under its share of a full queue gets in, and
the newest queued request of the tenant over its share is the one answered 429 (pushed out)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import httpx
import pytest

from engine import AsyncEngine
from gateway.settings import GatewaySettings
from tests.gateway.conftest import Hogs, Server, start_server, wait_for


@pytest.fixture()
def four(server: Server) -> Iterator[Server]:
    """A second gateway on the suite's engine and database with a four-request global queue."""
    engine = server.state.engine
    assert isinstance(engine, AsyncEngine)
    settings = GatewaySettings(
        data_dir=server.state.settings.data_dir,
        port=0,
        engine=engine.config,
        max_queued_requests=4,
        retry_jitter=0.0,
    )
    srv = start_server(settings, engine)
    srv.keys, srv.tenants = server.keys, server.tenants
    yield srv
    srv.stop()


def _post(srv: Server, tenant: str, request_id: str, out: dict[str, httpx.Response]) -> None:
    body = {"model": srv.model, "prompt": "fair share", "max_tokens": 1}
    with httpx.Client(base_url=srv.url, timeout=120) as c:
        out[request_id] = c.post(
            "/v1/completions", json=body, headers=srv.headers(tenant, **{"X-Request-Id": request_id})
        )


def _queued(srv: Server, tenant_id: str, n: int) -> Callable[[], bool]:
    return lambda: srv.state.admission.queues.queued(tenant_id) == n


def test_under_share_tenant_pushes_out_the_newest_over_share_request(server: Server, four: Server) -> None:
    answers: dict[str, httpx.Response] = {}
    threads: list[threading.Thread] = []
    bob = four.tenants["bob"].id
    with Hogs(server):  # every engine slot busy: what the gateway admits stays queued
        for i in range(4):  # bob alone borrows the whole queue
            threads.append(threading.Thread(target=_post, args=(four, "bob", f"fair-bob-{i}", answers)))
            threads[-1].start()
            wait_for(_queued(four, bob, i + 1), 20, f"bob's {i + 1} queued")
        threads.append(threading.Thread(target=_post, args=(four, "alice", "fair-alice", answers)))
        threads[-1].start()
        wait_for(lambda: "fair-bob-3" in answers, 20, "bob's newest answered")
        pushed = answers["fair-bob-3"]
        assert pushed.status_code == 429, pushed.text
        assert pushed.json()["error"]["code"] == "pushed_out"
        assert int(pushed.headers["retry-after"]) >= 1
        assert four.state.admission.queues.queued(four.tenants["alice"].id) == 1
        assert four.state.admission.queues.queued(bob) == 3
        _post(four, "bob", "fair-bob-more", answers)  # bob, over its share of the full queue: its own 429
        assert answers["fair-bob-more"].status_code == 429, answers["fair-bob-more"].text
        assert answers["fair-bob-more"].json()["error"]["code"] == "over_share"
        assert int(answers["fair-bob-more"].headers["retry-after"]) >= 1
    for t in threads:
        t.join(120)
    assert answers["fair-alice"].status_code == 200, answers["fair-alice"].text
    assert [answers[f"fair-bob-{i}"].status_code for i in range(3)] == [200, 200, 200]
    # The pushed-out request reached the engine, so it has its ledger row (cancelled, nothing billed twice).
    rows = wait_for(lambda: four.usage_rows("request_id = :r", r="fair-bob-3"), 20, "the pushed-out row")
    assert [r["status"] for r in rows] == ["cancelled"] and rows[0]["completion_tokens"] == 0


def test_push_out_ties_rotate_between_equally_loaded_tenants(server: Server, four: Server) -> None:
    """Issue 45: bob and carol hold equal halves of the full queue and refill what they lose; each of
    alice's arrivals (under her share) pushes one out. The hits take turns: before, all fell on bob, the
    earliest backlogged tenant. Alice's request is cancelled each round to make the refill's room."""
    if "carol" not in server.tenants:
        server.add_tenant("carol")
    answers: dict[str, httpx.Response] = {}
    threads: list[threading.Thread] = []
    ids = {name: four.tenants[name].id for name in ("alice", "bob", "carol")}
    sent = {"bob": 0, "carol": 0}

    def send(tenant: str, request_id: str) -> None:
        threads.append(threading.Thread(target=_post, args=(four, tenant, request_id, answers)))
        threads[-1].start()

    def refill(tenant: str) -> None:
        before = four.state.admission.queues.queued(ids[tenant])
        send(tenant, f"rot-{tenant}-{sent[tenant]}")
        sent[tenant] += 1
        wait_for(_queued(four, ids[tenant], before + 1), 20, f"{tenant}'s request queued")

    def pushed_out() -> list[str]:
        return [rid for rid, r in answers.items() if r.status_code == 429 and rid.startswith("rot-")]

    def pushed_out_count(n: int) -> Callable[[], bool]:
        return lambda: len(pushed_out()) == n

    hits: list[str] = []
    with Hogs(server), httpx.Client(base_url=four.url, timeout=60) as alice:
        for tenant in ("bob", "carol", "bob", "carol"):  # bob backlogged first
            refill(tenant)
        for r in range(4):
            send("alice", f"rot-alice-{r}")
            wait_for(pushed_out_count(r + 1), 20, f"push-out {r + 1}")
            loser = pushed_out()[-1]
            assert answers[loser].json()["error"]["code"] == "pushed_out", answers[loser].text
            hits.append(loser.split("-")[1])
            wait_for(_queued(four, ids["alice"], 1), 20, "alice's request queued")
            cancelled = alice.post(f"/v1/requests/rot-alice-{r}/cancel", headers=four.headers("alice"))
            assert cancelled.status_code == 200, cancelled.text
            wait_for(_queued(four, ids["alice"], 0), 20, "alice's request out of the queue")
            refill(hits[-1])
    for t in threads:
        t.join(120)
    assert hits.count("bob") == hits.count("carol") == 2, hits
