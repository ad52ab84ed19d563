"""kill -9 of the gateway, of its engine worker, or both, under load: no answered request is missing from the
ledger once the gateway is back (real `fairserve serve` processes, real HTTP, SQLite and PostgreSQL)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import threading
import uuid
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from billing import BillingStore, Database, default_db_url
from tests.billing.conftest import pg_url  # noqa: F401  (the fixture, for the PostgreSQL runs)
from tests.gateway.conftest import wait_for
from tests.gateway.ops.test_engine_watch import engine_workers
from tests.gateway.serve_process import ServeProcess

CLIENTS = 6
ANSWERED_BEFORE_KILL = 100


class Load:
    """Client threads sending uniquely identified requests; `answered` holds the ids whose whole reply came."""

    def __init__(self, url: str, key: str, model: str) -> None:
        self.url, self.key, self.model = url, key, model
        self.answered: set[str] = set()
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._client, args=(i,)) for i in range(CLIENTS)]
        for t in self.threads:
            t.start()

    def _one(self, client: httpx.Client, rng: random.Random) -> None:
        rid = f"kill-{uuid.uuid4().hex}"
        stream = rng.random() < 0.4
        body = {
            "model": self.model,
            "prompt": "count " * rng.randint(1, 30),
            "max_tokens": rng.randint(1, 24),
            "stream": stream,
        }
        headers = {"Authorization": f"Bearer {self.key}", "X-Request-Id": rid}
        if stream:
            with client.stream("POST", "/v1/completions", json=body, headers=headers) as resp:
                lines = [line for line in resp.iter_lines() if line]
            complete = resp.status_code == 200 and lines[-1:] == ["data: [DONE]"]
        else:
            resp = client.post("/v1/completions", json=body, headers=headers)
            complete = resp.status_code == 200 and json.loads(resp.content)["id"] is not None
        if complete:
            with self.lock:
                self.answered.add(rid)

    def _client(self, seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(base_url=self.url, timeout=30) as client:
            while not self.stop.is_set():
                try:
                    self._one(client, rng)
                except (httpx.HTTPError, json.JSONDecodeError, IndexError):
                    continue  # the kill cut this one off: not answered

    def finish(self) -> set[str]:
        self.stop.set()
        for t in self.threads:
            t.join(60)
        return set(self.answered)


def _billed(db_url: str, ids: set[str]) -> set[str]:
    db = Database(db_url)
    try:
        with db.engine.connect() as conn:
            found = {
                r[0]
                for r in conn.execute(text("SELECT request_id FROM usage WHERE request_id LIKE 'kill-%'"))
            }
    finally:
        db.dispose()
    return found & ids


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("victim", ["gateway", "engine", "both"])
@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_kill_9_loses_no_answered_request(
    tmp_path: Path, backend: str, victim: str, request: pytest.FixtureRequest
) -> None:
    db_url = request.getfixturevalue("pg_url") if backend == "postgresql" else default_db_url(tmp_path)
    serve = ServeProcess(tmp_path, "--db", db_url, "--max-num-seqs", "8")
    workers = engine_workers(serve.proc.pid)
    try:
        # A tenant of its own: the PostgreSQL database is shared by the run, so its demo tenant (and with it
        # the banner's api_key) belongs to whichever server started there first.
        db = Database(db_url)
        store = BillingStore(db)
        key = store.create_key(store.create_tenant(f"kill-{uuid.uuid4().hex[:8]}").id)[0]
        db.dispose()
        with httpx.Client(base_url=serve.url, timeout=30) as c:
            listed = c.get("/v1/models", headers={"Authorization": f"Bearer {key}"})
            assert listed.status_code == 200, (listed.text, serve.banner)
            model = listed.json()["data"][0]["id"]
        load = Load(serve.url, key, model)
        wait_for(lambda: len(load.answered) >= ANSWERED_BEFORE_KILL, 120, "answered requests under load")
        if victim in ("engine", "both"):
            for pid in workers:
                _kill(pid)
        if victim in ("gateway", "both"):
            serve.proc.kill()
            serve.proc.wait(30)
        else:  # the gateway lives on and replaces its worker; let a few more requests through it
            seen = len(load.answered)
            wait_for(lambda: len(load.answered) > seen + 5, 120, "answers from the replacement worker")
        answered = load.finish()
    finally:
        serve.stop()
        for pid in workers + engine_workers_left(serve):
            _kill(pid)
    # A restart replays the journal before it serves; then every answered id must be billed.
    again = ServeProcess(tmp_path, "--db", db_url, "--max-num-seqs", "8")
    try:
        missing = answered - _billed(db_url, answered)
        print(
            f"kill -9 of {victim} on {backend}: {len(answered)} answered, {len(missing)} missing from the ledger"
        )
        assert len(answered) >= ANSWERED_BEFORE_KILL
        assert missing == set(), (
            f"{len(missing)} of {len(answered)} answered requests missing from the ledger"
        )
    finally:
        again.stop()


def engine_workers_left(serve: ServeProcess) -> list[int]:
    """Workers of a gateway that is still alive (none once it is gone)."""
    try:
        return engine_workers(serve.proc.pid)
    except OSError:
        return []
