"""Issue 15's acceptance on real processes: 2 `fairserve engine` + 2 `fairserve serve --engine E1 --engine E2`,
one PostgreSQL ledger and one Redis shared by all four.

One module-scoped cluster serves every test (process start-up is most of the cost); the failure drill runs
last because it kills and restarts an engine. Each test uses tenants of its own.

How the fairness ratios are measured (tests 1 and 2). Each tenant sends through one gateway only, from
closed-loop client threads: CLIENTS requests always in flight per tenant, against 2 engines of MAX_SEQS
seats, so (with the routers spreading each gateway's requests by load) both tenants keep requests queued
on both engines; the test checks that at the end of the window (every engine has waiting requests and
both gateways have requests live on both engines). The window opens once both tenants have WARM_UP
answers (the counters of both engines have met through Redis) and closes when the lighter tenant has
WINDOW more. A:B is the ratio of the ledger's `charged_service` (the unweighted cost the VTC charged:
w_in·prompt computed + w_out·output, cached prompt tokens free, plus the step cost's attention and
per-sequence terms, engine/core/step_cost.py) summed over the requests each client saw
finish inside the window: that is the quantity VTC divides by the weight and equalises, so weights 4:1
must give 4:1 of it. The requests are short (MAX_TOKENS) so the whole-request granularity at the window's
edges is a few percent at most.
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from sqlalchemy import text

from billing import BillingStore, Database
from tests.billing.conftest import pg_url  # noqa: F401  (the fixture: one ledger database for both gateways)
from tests.billing.services import REDIS_URL, require
from tests.engine.serving.remote.engine_process import EngineProcess
from tests.gateway.conftest import wait_for
from tests.gateway.serve_process import ServeProcess

# Shares of two engines measured on this machine's two cores, which they need to themselves: beside the
# parallel part's other tests the affinity case read A:B 0.60 and 0.66 (1.0 alone, and in the serial part).
pytestmark = pytest.mark.serial

MAX_SEQS = 4
CLIENTS = 16  # per tenant: 2x the seats of both engines, so each tenant stays queued on both
MAX_TOKENS = 12
WARM_UP = 20
WINDOW = 150  # answers of the lighter tenant inside the window
CALL_DEADLINE_S = 30.0  # no client call may take longer, killed engine or not
AFFINITY_WEIGHT = "4"  # a prefix outweighs 16 waiting requests: A stays where its prefix is (test 2)


@dataclass
class Cluster:
    """The four processes and what the tests need to talk to them."""

    tmp: Path
    db_url: str
    engine_args: tuple[str, ...]
    engines: list[EngineProcess]
    gateways: list[ServeProcess]
    model: str = ""
    stopped: list[EngineProcess] = field(default_factory=list)

    def tenant(self, weight: float) -> tuple[str, str]:
        """A new tenant of `weight` in the shared ledger database: (its API key, its id)."""
        db = Database(self.db_url)
        try:
            store = BillingStore(db)
            tenant_id = store.create_tenant(f"scale-{uuid.uuid4().hex[:8]}", weight=weight).id
            return store.create_key(tenant_id)[0], tenant_id
        finally:
            db.dispose()

    def engine_rows(self, gateway: ServeProcess) -> dict[str, dict[str, Any]]:
        """/admin/api/engines of a gateway, by engine address."""
        resp = httpx.get(
            f"{gateway.url}/admin/api/engines",
            timeout=10,
            headers={"Authorization": f"Bearer {gateway.banner['admin_token']}"},
        )
        assert resp.status_code == 200, resp.text
        return {row["key"]: row for row in resp.json()["engines"]}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, pg_url: str) -> Iterator[Cluster]:  # noqa: F811
    require("127.0.0.1", 6379, "Redis")
    tmp = tmp_path_factory.mktemp("scale-out")
    prefix = f"test:scale-out:{uuid.uuid4().hex}"
    engine_args = (
        "--num-kv-blocks",
        "512",
        "--max-num-seqs",
        str(MAX_SEQS),
        "--max-num-batched-tokens",
        "64",
        "--redis",
        REDIS_URL,
        "--counter-sync-prefix",
        prefix,
        "--counter-sync-interval-s",
        "0.02",
    )
    engines: list[EngineProcess] = []
    gateways: list[ServeProcess] = []
    c = Cluster(tmp, pg_url, engine_args, engines, gateways)
    try:
        for i in range(2):
            engines.append(EngineProcess(tmp / f"engine{i}", *engine_args))
        attach = [arg for e in engines for arg in ("--engine", e.address)]
        for i in range(2):
            gateways.append(
                ServeProcess(
                    tmp / f"gateway{i}",
                    "--db",
                    pg_url,
                    "--redis",
                    REDIS_URL,
                    "--redis-timeout",
                    "2",
                    "--affinity-weight",
                    AFFINITY_WEIGHT,
                    *attach,
                )
            )
        c.model = httpx.get(
            f"{gateways[0].url}/v1/models",
            timeout=10,
            headers=gateways[0].headers(gateways[0].banner["api_key"]),
        ).json()["data"][0]["id"]
        yield c
    finally:
        for g in gateways:
            g.stop()
        for e in [*engines, *c.stopped]:
            e.kill()
        client = redis.Redis.from_url(REDIS_URL)
        keys = list(client.scan_iter(f"{prefix}:*"))
        if keys:
            client.delete(*keys)
        client.close()


class ClosedLoop:
    """`clients` threads, each sending its next request as soon as the last one ends.

    `answered` maps request id -> monotonic time its whole reply arrived; `slowest` is the longest call
    (answered or not), so a stuck stream shows up even when it is cut off by the client timeout.
    """

    def __init__(
        self,
        url: str,
        key: str,
        model: str,
        prompt: Callable[[random.Random], str],
        clients: int = CLIENTS,
        stream_share: float = 0.0,
    ) -> None:
        self.url, self.key, self.model, self.prompt, self.stream_share = url, key, model, prompt, stream_share
        self.answered: dict[str, float] = {}
        self.failed = 0
        self.slowest = 0.0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(clients)]
        for t in self.threads:
            t.start()

    def _one(self, client: httpx.Client, rng: random.Random) -> bool:
        rid = f"scale-{uuid.uuid4().hex}"
        stream = rng.random() < self.stream_share
        body = {
            "model": self.model,
            "prompt": self.prompt(rng),
            "max_tokens": MAX_TOKENS,
            "ignore_eos": True,
            "stream": stream,
        }
        headers = {"Authorization": f"Bearer {self.key}", "X-Request-Id": rid}
        if stream:
            with client.stream("POST", "/v1/completions", json=body, headers=headers) as resp:
                lines = [line for line in resp.iter_lines() if line]
            complete = (
                resp.status_code == 200 and lines[-1:] == ["data: [DONE]"] and '"error"' not in lines[-2]
            )
        else:
            resp = client.post("/v1/completions", json=body, headers=headers)
            complete = (
                resp.status_code == 200
                and json.loads(resp.content)["usage"]["completion_tokens"] == MAX_TOKENS
            )
        if complete:
            with self.lock:
                self.answered[rid] = time.monotonic()
        return complete

    def _client(self, seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(base_url=self.url, timeout=CALL_DEADLINE_S * 2) as client:
            while not self.stop.is_set():
                began = time.monotonic()
                try:
                    ok = self._one(client, rng)
                except (httpx.HTTPError, json.JSONDecodeError, IndexError, KeyError):
                    ok = False
                with self.lock:
                    self.slowest = max(self.slowest, time.monotonic() - began)
                    self.failed += not ok

    def count(self, since: float = 0.0) -> int:
        with self.lock:
            return sum(1 for t in self.answered.values() if t >= since)

    def between(self, t0: float, t1: float) -> set[str]:
        with self.lock:
            return {rid for rid, t in self.answered.items() if t0 <= t <= t1}

    def finish(self, timeout: float = CALL_DEADLINE_S * 2 + 10) -> None:
        """Stop sending and wait for every thread's last call (bounded: a stuck call fails the test)."""
        self.stop.set()
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        assert not any(t.is_alive() for t in self.threads), "a client call did not end"


def charged(db_url: str, ids: set[str]) -> tuple[float, int]:
    """(sum of charged_service, rows found) in the ledger over `ids`."""
    db = Database(db_url)
    try:
        with db.engine.connect() as conn:
            rows = conn.execute(
                text("SELECT request_id, charged_service FROM usage WHERE request_id LIKE 'scale-%'")
            )
            found = [(rid, service) for rid, service in rows if rid in ids]
    finally:
        db.dispose()
    return sum(s for _, s in found), len(found)


def tenant_rows(db_url: str, tenant_id: str) -> set[str]:
    """Request ids the ledger holds for a tenant."""
    db = Database(db_url)
    try:
        with db.engine.connect() as conn:
            return {
                r[0]
                for r in conn.execute(
                    text("SELECT request_id FROM usage WHERE tenant_id = :t"), {"t": tenant_id}
                )
            }
    finally:
        db.dispose()


def ledger_service(db_url: str, ids: set[str]) -> float:
    """The charged service of `ids`, once the gateways' ledgers have written every one of them."""

    def complete() -> float | None:
        service, found = charged(db_url, ids)
        return service if found == len(ids) else None

    return float(wait_for(complete, 30, f"{len(ids)} ledger rows"))


def served_ratio(
    c: Cluster,
    a: ClosedLoop,
    b: ClosedLoop,
    spread: tuple[bool, bool] = (True, True),
    window: int = WINDOW,
) -> float:
    """A:B of charged service over the window in which both were backlogged (module docstring).

    Checked as the window closes: every engine has requests waiting, and each gateway has at least SEATS of
    its tenant's requests live (more than both engines can run). Where `spread` says so for a gateway, it also
    has requests live on both engines (its tenant reached both); the affinity case lets A be pinned to one.
    """
    try:
        wait_for(lambda: a.count() >= WARM_UP and b.count() >= WARM_UP, 120, "both tenants warmed up")
        t0 = time.monotonic()
        wait_for(
            lambda: min(a.count(t0), b.count(t0)) >= window, 240 * window / WINDOW, "the window's answers"
        )
        t1 = time.monotonic()
        for g, spread_here in zip(c.gateways, spread, strict=True):  # still backlogged as the window closed
            rows = c.engine_rows(g)
            seen = {k: (r["waiting"], r["in_flight"]) for k, r in rows.items()}
            assert all(waiting > 0 for waiting, _ in seen.values()), seen
            assert sum(in_flight for _, in_flight in seen.values()) > 2 * MAX_SEQS, seen
            assert not spread_here or all(in_flight >= 2 for _, in_flight in seen.values()), seen
    finally:
        a.finish()
        b.finish()
    in_a, in_b = a.between(t0, t1), b.between(t0, t1)
    service_a, service_b = ledger_service(c.db_url, in_a), ledger_service(c.db_url, in_b)
    print(
        f"\n  window {t1 - t0:.1f}s: A {len(in_a)} requests, {service_a:.0f} service; "
        f"B {len(in_b)} requests, {service_b:.0f} service; A:B = {service_a / service_b:.3f}"
    )
    return service_a / service_b


def short_prompt(rng: random.Random) -> str:
    """A prompt whose first block is its own (a random head), so prefix affinity never pulls it anywhere."""
    return f"{rng.getrandbits(64):016x} " + " ".join(
        rng.choice(("count", "to", "ten", "and", "back")) for _ in range(rng.randint(4, 12))
    )


LONG_PREFIX = (
    "the shared system prompt of tenant a says " * 16
)  # 673 tokens: well past affinity_blocks x block_size


def test_weights_4_to_1_hold_across_two_gateways_with_skewed_ingress(cluster: Cluster) -> None:
    """Dynamo's failure (fairness state per router: 4:1 came out 1:1) cannot happen here: the fairness state is
    in the engines, and both routers spread their tenant over both engines. This also holds without the shared
    counters (measured 3.98 with engines lacking `--redis`); test 2 is the one that needs them.

    CI once read 3.59 here: routing by load alone, the two gateways could settle with A's requests mostly on
    one engine and B's on the other (the window's end check saw A with 1 in flight on one engine, 14 on the
    other), and an engine without a competitor serves its tenant whole. The router's tenant spread term
    (routing/score.py) keeps each tenant on both engines."""
    (key_a, _), (key_b, _) = cluster.tenant(4.0), cluster.tenant(1.0)
    g1, g2 = cluster.gateways
    a = ClosedLoop(g1.url, key_a, cluster.model, short_prompt)
    b = ClosedLoop(g2.url, key_b, cluster.model, short_prompt)
    ratio = served_ratio(cluster, a, b)
    print(f"  skewed ingress, weights 4:1: A:B = {ratio:.3f}")
    assert abs(ratio / 4.0 - 1) <= 0.10, f"A:B = {ratio:.3f}, want 4 within 10%"


def test_affinity_does_not_pin_a_tenant_below_its_share(cluster: Cluster) -> None:
    """A's prompts share a 673-token prefix, and the gateways weigh affinity at AFFINITY_WEIGHT, so A's requests
    go to the engine holding its prefix until that engine is 16 waiting requests busier than the other. B has
    twice A's clients and no prefix, and spreads over both engines by load. Either way each tenant's VTC
    counter on each engine counts its service on both (Redis), so A gets the whole of its engine when B is
    served on the other, and 1:1 holds. Measured without `--redis` on the engines (local counters), the same
    test pins A (137:0 requests) and gives A:B = 0.263: A's engine splits 1:1, B also has the other engine.
    """
    (key_a, _), (key_b, _) = cluster.tenant(1.0), cluster.tenant(1.0)
    g1, g2 = cluster.gateways
    before = {k: r["routed"] for k, r in cluster.engine_rows(g1).items()}
    a = ClosedLoop(g1.url, key_a, cluster.model, lambda rng: LONG_PREFIX + short_prompt(rng))
    b = ClosedLoop(g2.url, key_b, cluster.model, short_prompt, clients=2 * CLIENTS)
    # Twice the window: each of A's requests attends over its 673 cached tokens, which the step cost charges
    # (engine/core/step_cost.py), so A's charges come in coarser pieces than B's and the window's edges and
    # the counters' exchange move a 150-answer window by up to 11% on a loaded CI host (0.892 there, 2026-12-07;
    # run alone it passed).
    ratio = served_ratio(cluster, a, b, spread=(False, True), window=2 * WINDOW)
    split = [r["routed"] - before[k] for k, r in cluster.engine_rows(g1).items()]
    print(f"  shared long prefix for A, weights 1:1: A:B = {ratio:.3f}; A's requests per engine {split}")
    assert abs(ratio - 1) <= 0.10, f"A:B = {ratio:.3f}, want 1 within 10%"


def test_a_retry_on_the_other_gateway_attaches_to_the_running_request(cluster: Cluster) -> None:
    key, tenant_id = cluster.tenant(1.0)
    g1, g2 = cluster.gateways
    idem = uuid.uuid4().hex
    rid = f"scale-idem-{idem[:8]}"
    body = {
        "model": cluster.model,
        "prompt": "count to a thousand",
        "max_tokens": 200,
        "ignore_eos": True,
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {key}", "Idempotency-Key": idem}
    owner: list[str] = []
    with (
        httpx.Client(timeout=CALL_DEADLINE_S * 2) as client,
        client.stream(
            "POST", f"{g1.url}/v1/completions", json=body, headers={**headers, "X-Request-Id": rid}
        ) as resp,
    ):
        assert resp.status_code == 200
        lines = (line for line in resp.iter_lines() if line)
        owner.append(next(lines))  # it is generating on an engine now
        with client.stream(
            "POST", f"{g2.url}/v1/completions", json=body, headers={**headers, "X-Request-Id": f"{rid}-retry"}
        ) as retry:
            retry_lines = (line for line in retry.iter_lines() if line)
            follower = [next(retry_lines)]
            # Attached, not replayed: the run is still live on gateway 1 (nothing else runs in the cluster now).
            running = sum(r["in_flight"] for r in cluster.engine_rows(g1).values())
            follower += list(retry_lines)
        owner += list(lines)
    assert running == 1, "the owner's run had ended before the retry attached"
    assert owner[-1] == "data: [DONE]"
    assert retry.status_code == 200
    assert retry.headers.get("idempotent-replayed") == "true", dict(retry.headers)
    assert retry.headers["x-request-id"] == rid
    assert follower == owner
    # A barrier, not a sleep: gateway 2 writes its ledger in order, so once a later request of this tenant
    # through it is billed, a second run of the retry would be billed too.
    sentinel = f"scale-sentinel-{idem[:8]}"
    done = httpx.post(
        f"{g2.url}/v1/completions",
        timeout=CALL_DEADLINE_S,
        json={**body, "stream": False, "max_tokens": 1},
        headers={"Authorization": f"Bearer {key}", "X-Request-Id": sentinel},
    )
    assert done.status_code == 200, done.text
    wait_for(lambda: tenant_rows(cluster.db_url, tenant_id) >= {rid, sentinel}, 30, "the ledger rows")
    assert tenant_rows(cluster.db_url, tenant_id) == {rid, sentinel}, (
        "the retry ran on an engine a second time"
    )


def test_kill_9_of_one_engine_under_load_through_both_gateways(cluster: Cluster) -> None:
    """No stuck call, nothing answered missing from the ledger, the survivor serves on, the dead one rejoins."""
    (key_a, _), (key_b, _) = cluster.tenant(1.0), cluster.tenant(1.0)
    g1, g2 = cluster.gateways
    loads = [
        ClosedLoop(g.url, k, cluster.model, short_prompt, clients=6, stream_share=0.5)
        for g, k in ((g1, key_a), (g2, key_b))
    ]
    victim = cluster.engines[0]
    try:
        wait_for(lambda: all(load.count() >= 10 for load in loads), 120, "answers before the kill")
        wait_for(
            lambda: all(cluster.engine_rows(g)[victim.address]["in_flight"] > 0 for g in cluster.gateways),
            30,
            "requests of both gateways on the victim",
        )
        victim.kill()
        cluster.stopped.append(victim)
        killed_at = time.monotonic()
        wait_for(
            lambda: all(not cluster.engine_rows(g)[victim.address]["alive"] for g in cluster.gateways),
            5,
            "both gateways to drop the dead engine",
        )
        dropped_after = time.monotonic() - killed_at
        survivor_took = time.monotonic()
        wait_for(lambda: all(load.count(survivor_took) >= 10 for load in loads), 60, "the survivor's answers")
        failed_by_kill = sum(
            load.failed for load in loads
        )  # the victim's in-flight requests (503, error event)

        restarted = EngineProcess(cluster.tmp / "engine0", *cluster.engine_args, port=victim.port)
        cluster.engines[0] = restarted
        wait_for(
            lambda: all(cluster.engine_rows(g)[victim.address]["alive"] for g in cluster.gateways),
            30,
            "both gateways to see the engine back",
        )
        routed = {g.url: cluster.engine_rows(g)[victim.address]["routed"] for g in cluster.gateways}
        wait_for(
            lambda: all(
                cluster.engine_rows(g)[victim.address]["routed"] > routed[g.url] + 3 for g in cluster.gateways
            ),
            60,
            "requests routed to the restarted engine",
        )
    finally:
        for load in loads:
            load.finish()
    answered = set().union(*(set(load.answered) for load in loads))
    ledger_service(cluster.db_url, answered)  # fails unless every answered request is billed
    slowest = max(load.slowest for load in loads)
    failed = sum(load.failed for load in loads)
    assert failed == failed_by_kill, f"{failed - failed_by_kill} requests failed after the survivor took over"
    print(
        f"\n  kill -9 drill: dropped from rotation in {dropped_after:.2f}s; {len(answered)} answered, "
        f"all in the ledger; {failed} failed (in flight on the victim); slowest call {slowest:.1f}s"
    )
