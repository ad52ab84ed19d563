"""Billing under chaos: 2 gateways + 2 engines on PostgreSQL with Redis, killed and restarted under load.

    .venv/bin/python -m bench.billing_chaos [--requests 20000] [--clients 12] [--seed N] [--db URL]

Real processes (the test suite's helpers), one tenant; keyed retries, client disconnects and server cancels
among the requests; kill -9 of an engine, of a gateway and a Redis restart at 20%, 40% and 60% of them.
Prints the figures as JSON (docs/billing.md, "Chaos benchmark").
"""

from __future__ import annotations

import json
import random
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import text

from bench.harness import parser, served_model
from billing import BillingStore, Database
from engine.serving.remote.client import RemoteEngine
from engine.serving.remote.liveness import SilenceBounds
from engine.serving.remote.messages import Produced
from gateway.ops.produced import engine_totals
from tests.billing.services import fresh_pg_database
from tests.engine.serving.remote.engine_process import EngineProcess
from tests.gateway.serve_process import ServeProcess
from tests.redis_server import RedisServer

ENGINE_ARGS = ("--max-num-seqs", "8", "--num-kv-blocks", "512")
SETTLE_S = 60.0  # dead gateways' records are billed after 10 s; bound for every quiet wait


@dataclass
class Figures:
    """What one run found (printed as JSON)."""

    requests: int
    answered: int = 0
    retried: int = 0
    disconnects: int = 0
    server_cancels: int = 0
    failed: int = 0
    rows: int = 0
    double_charges: int = 0
    answered_unbilled: int = 0
    quarantined: int = 0
    ledger_completion_tokens: int = 0
    engine_produced_tokens: int = 0
    # Completion tokens of rows `error` no engine ever finished (running on the engine when it was killed):
    # the gateway billed what it had seen; the engine's count died with it.
    killed_engine_tokens: int = 0
    error_rows: int = 0
    unconfirmed_at_end: int = 0  # engine records no gateway confirmed (see docs/billing.md, chaos benchmark)
    disconnect_produced_tokens: int = 0
    disconnect_delivered_tokens: int = 0
    interrupted_rows: int = 0
    events: list[str] = field(default_factory=list)
    failures: dict[str, int] = field(default_factory=dict)  # why attempts were not answered
    seconds: float = 0.0

    @property
    def tokens_match(self) -> bool:
        """The ledger's completion tokens equal the engines' produced ones (killed engine set aside)."""
        return self.ledger_completion_tokens - self.killed_engine_tokens == self.engine_produced_tokens


class Cluster:
    """Two engines, two gateways attached to both, a private Redis, one tenant."""

    def __init__(self, tmp: Path, db_url: str) -> None:
        self.tmp, self.db_url = tmp, db_url
        self.restarting = threading.Lock()
        self.redis = RedisServer(tmp / "redis")
        self.engines = [EngineProcess(tmp / f"engine{i}", *ENGINE_ARGS) for i in range(2)]
        self.gateways = [self._gateway(i) for i in range(2)]
        db = Database(db_url)
        db.upgrade()
        store = BillingStore(db)
        self.tenant_id = store.create_tenant(f"chaos-{uuid.uuid4().hex[:8]}").id
        self.key = store.create_key(self.tenant_id)[0]
        db.dispose()
        self.model = served_model(self.gateways[0].url, self.key)

    def _gateway(self, i: int) -> ServeProcess:
        attach = [a for e in self.engines for a in ("--engine", e.address)]
        redis = ("--redis", self.redis.url, "--redis-timeout", "1")
        return ServeProcess(self.tmp / f"gateway{i}", "--db", self.db_url, *redis, *attach)

    def auth(self, **extra: str) -> dict[str, str]:
        """The tenant's Authorization plus extra headers."""
        return {"Authorization": f"Bearer {self.key}", **extra}

    def kill_gateway(self, i: int) -> None:
        """kill -9 gateway i, then start it again on its data dir (its journal is replayed) once no
        engine is restarting (a gateway starts only with every --engine answering)."""
        self.gateways[i].proc.kill()
        self.gateways[i].proc.wait(30)
        with self.restarting:
            self.gateways[i] = self._gateway(i)

    def kill_engine(self, i: int) -> None:
        """kill -9 engine i, then start it again on the same port (the gateways rejoin it)."""
        port = self.engines[i].port
        with self.restarting:
            self.engines[i].kill()
            self.engines[i] = EngineProcess(self.tmp / f"engine{i}", *ENGINE_ARGS, port=port)

    def restart_redis(self) -> None:
        """Kill the Redis server and start it again, empty, on the same port."""
        self.redis.kill()
        self.redis.start()

    def close(self) -> None:
        """Stop the gateways gracefully (their ledgers flush), then the engines and Redis."""
        for g in self.gateways:
            g.stop()
        for e in self.engines:
            e.kill()
        self.redis.stop()


class Load:
    """Client threads: requests of every kind, answered ids, idempotent retries."""

    def __init__(self, cluster: Cluster, total: int, clients: int, seed: int) -> None:
        self.cluster, self.total = cluster, total
        self.sent = 0
        self.lock = threading.Lock()
        self.answered: set[str] = set()
        self.keyed: dict[str, str] = {}  # request id -> its idempotency key
        self.disconnected: set[str] = set()
        self.figures = Figures(total)
        self.threads = [threading.Thread(target=self._client, args=(seed + i,)) for i in range(clients)]

    def _next(self) -> int | None:
        with self.lock:
            if self.sent >= self.total:
                return None
            self.sent += 1
            return self.sent

    def _client(self, seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(timeout=30) as http:
            while (n := self._next()) is not None:
                self._request(http, rng, n)

    def _request(self, http: httpx.Client, rng: random.Random, n: int) -> None:
        kind = rng.random()
        stream = kind < 0.6
        body = {"model": self.cluster.model, "prompt": "chaos " * rng.randint(1, 12), "stream": stream}
        body["max_tokens"] = rng.randint(2, 16)
        key = uuid.uuid4().hex if rng.random() < 0.3 else None
        attempt = tries = 0
        while tries < 8 and attempt < (3 if key else 1):
            tries += 1
            rid = f"chaos-{n}-{tries}-{uuid.uuid4().hex[:6]}"
            headers = self.cluster.auth(**{"X-Request-Id": rid, "X-Attempt": str(attempt)})
            if key:
                headers["Idempotency-Key"] = key
                with self.lock:
                    self.keyed[rid] = key
            gateway = self.cluster.gateways[(n + tries) % 2]  # a load balancer's next choice
            try:
                if stream and 0.6 - kind < 0.06:  # the client leaves after a few events
                    self._disconnect(http, gateway.url, body, headers, rid)
                    return
                if 0.6 <= kind < 0.65:  # cancelled by the server mid-way
                    body = {**body, "max_tokens": 64, "stream": False}
                    threading.Timer(0.05, self._cancel, (gateway.url, rid)).start()
                if self._whole(http, gateway.url, body, headers):
                    with self.lock:
                        self.answered.add(rid)
                    return
            except httpx.ConnectError:  # that gateway is down: nothing was sent, try the other one
                self._failed("ConnectError")
                continue
            except (httpx.HTTPError, json.JSONDecodeError, IndexError, KeyError) as exc:
                self._failed(type(exc).__name__)
            attempt += 1
            with self.lock:
                self.figures.retried += 1 if key and attempt < 3 else 0
        with self.lock:
            self.figures.failed += 1

    def _failed(self, reason: str) -> None:
        with self.lock:
            self.figures.failures[reason] = self.figures.failures.get(reason, 0) + 1

    def _whole(self, http: httpx.Client, url: str, body: dict[str, Any], headers: dict[str, str]) -> bool:
        """True when the whole reply came (a complete JSON, or a stream to its [DONE])."""
        if body["stream"]:
            with http.stream("POST", f"{url}/v1/completions", json=body, headers=headers) as resp:
                lines = [line for line in resp.iter_lines() if line]
            whole = resp.status_code == 200 and lines[-1:] == ["data: [DONE]"] and "error" not in lines[-2]
        else:
            resp = http.post(f"{url}/v1/completions", json=body, headers=headers)
            whole = resp.status_code == 200 and bool(resp.json()["id"])
        if not whole:
            code = "cut off" if resp.status_code == 200 else "error"
            if not body["stream"] and resp.status_code != 200:
                code = resp.json()["error"]["code"]
            self._failed(f"{resp.status_code} {code}")
        return whole

    def _disconnect(
        self, http: httpx.Client, url: str, body: dict[str, Any], headers: dict[str, str], rid: str
    ) -> None:
        long = {**body, "max_tokens": 64, "ignore_eos": True}
        with http.stream("POST", f"{url}/v1/completions", json=long, headers=headers) as resp:
            for n, _line in enumerate(resp.iter_lines(), 1):
                if n >= 4:
                    break
        with self.lock:
            self.disconnected.add(rid)
            self.figures.disconnects += 1

    def _cancel(self, url: str, rid: str) -> None:
        try:
            httpx.post(f"{url}/v1/requests/{rid}/cancel", headers=self.cluster.auth(), timeout=10)
            with self.lock:
                self.figures.server_cancels += 1
        except httpx.HTTPError:
            pass


def _chaos(cluster: Cluster, load: Load, figures: Figures) -> list[threading.Thread]:
    """The three faults, each when its share of the requests has been sent; the restarts of a killed
    gateway or engine run on threads of their own, so the next fault still lands under load."""
    restarts: list[threading.Thread] = []
    for share, name, fault in (
        (0.2, "kill -9 engine 1", lambda: cluster.kill_engine(1)),
        (0.4, "kill -9 gateway 1", lambda: cluster.kill_gateway(1)),
        (0.6, "redis restart", cluster.restart_redis),
    ):
        while load.sent < share * load.total and any(t.is_alive() for t in load.threads):
            time.sleep(0.01)
        figures.events.append(f"{name} at request {load.sent}")
        restarts.append(threading.Thread(target=fault))
        restarts[-1].start()
    return restarts


def _engine_books(cluster: Cluster, since: float) -> list[Produced]:
    """Every engine's produced-token totals since `since` and its count of unconfirmed records."""
    answers = []
    for e in cluster.engines:
        remote = RemoteEngine(e.address, SilenceBounds(5.0, 5.0))
        try:
            remote.start()
            answers.append(remote.produced_now(since))
        finally:
            remote.shutdown(timeout_s=1.0)
    return answers


def _engine_finished(tmp: Path) -> set[str]:
    """Caller request ids every engine finished, from their produced-token books on disk."""
    ids: set[str] = set()
    for log in tmp.glob("engine*/produced.log"):
        for line in log.read_bytes().splitlines():
            doc = json.loads(line)
            if "f" in doc:
                ids.add(doc["f"][1][1])  # ProducedRecord.ledger_request_id
    return ids


def _ledger(cluster: Cluster, load: Load, figures: Figures) -> None:
    db = Database(cluster.db_url)
    query = "SELECT request_id, status, completion_tokens, delivered_tokens FROM usage WHERE tenant_id = :t"
    with db.engine.connect() as conn:
        rows = conn.execute(text(query), {"t": cluster.tenant_id}).all()
    db.dispose()
    billed = {r[0] for r in rows}
    figures.rows = len(rows)
    figures.answered = len(load.answered)
    # A keyed retry may be answered from the idempotency record of an earlier attempt: billed under that id.
    billed_keys = {load.keyed[rid] for rid in billed if rid in load.keyed}
    unbilled = [r for r in load.answered - billed if load.keyed.get(r) not in billed_keys]
    figures.answered_unbilled = len(unbilled)
    finished = _engine_finished(cluster.tmp)
    completed_by_key: dict[str, int] = {}
    for rid, status, completion, delivered in rows:
        figures.ledger_completion_tokens += completion
        figures.killed_engine_tokens += completion if status == "error" and rid not in finished else 0
        figures.error_rows += status == "error"
        figures.interrupted_rows += status == "interrupted"
        if rid in load.keyed and status == "completed":
            completed_by_key[load.keyed[rid]] = completed_by_key.get(load.keyed[rid], 0) + 1
        if rid in load.disconnected:
            figures.disconnect_produced_tokens += completion
            figures.disconnect_delivered_tokens += delivered or 0
    figures.double_charges = sum(1 for n in completed_by_key.values() if n > 1)


def run(total: int, clients: int, seed: int, db_url: str | None) -> Figures:
    """One chaos run (on a fresh PostgreSQL database unless `db_url` is given); returns its figures."""
    if db_url is None:
        with fresh_pg_database("fairserve_chaos") as url:
            return run(total, clients, seed, url)
    started = time.monotonic()
    since = time.time() - 3600
    with tempfile.TemporaryDirectory(prefix="billing-chaos-") as tmp:
        cluster = Cluster(Path(tmp), db_url)
        try:
            load = Load(cluster, total, clients, seed)
            for t in load.threads:
                t.start()
            restarts = _chaos(cluster, load, load.figures)
            for t in [*load.threads, *restarts]:
                t.join()
            deadline = time.monotonic() + SETTLE_S  # dead gateways' requests billed by the live ones
            books = _engine_books(cluster, since)
            while sum(a.unconfirmed for a in books) and time.monotonic() < deadline:
                time.sleep(0.5)
                books = _engine_books(cluster, since)
            produced = engine_totals(books).get(cluster.tenant_id, {}).get("completion_tokens", 0)
            load.figures.unconfirmed_at_end = sum(a.unconfirmed for a in books)
        finally:
            cluster.close()
        figures = load.figures
        figures.engine_produced_tokens = produced
        _ledger(cluster, load, figures)
        figures.quarantined = sum(
            len(list((Path(tmp) / f"gateway{i}").glob("ledger.quarantine/*.json"))) for i in range(2)
        )
    figures.seconds = round(time.monotonic() - started, 1)
    return figures


def main() -> None:
    """Parse flags, run once, print the figures as JSON."""
    db_help = "ledger database URL (default: a fresh PostgreSQL database)"
    args = parser(__doc__, requests=20_000, clients=12, seed=0, db=(None, db_help)).parse_args()
    figures = run(args.requests, args.clients, args.seed, args.db)
    print(json.dumps({**asdict(figures), "tokens_match": figures.tokens_match}, indent=2))


if __name__ == "__main__":
    main()
