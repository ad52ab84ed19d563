"""One real `fairserve serve` process for the client tests, with tenants made over its admin API.

Two sequence slots only, so a couple of long "hog" streams fill the engine and the next request
queues: that is how the tests get a real 429 (a tenant queue bound of one) and a real queued wait.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text

from billing.db import default_db_url
from tests.gateway.conftest import wait_for
from tests.gateway.serve_process import ServeProcess


@dataclass
class Served:
    """The server process, its admin and tenant credentials, and the ledger it writes."""

    proc: ServeProcess
    data_dir: Path
    keys: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.proc.url

    @property
    def base_url(self) -> str:
        """What an OpenAI client takes as `base_url`."""
        return self.proc.url + "/v1"

    def admin(self) -> httpx.Client:
        """An httpx client holding the admin token."""
        return httpx.Client(
            base_url=self.url,
            timeout=30,
            headers={"Authorization": f"Bearer {self.proc.banner['admin_token']}"},
        )

    def add_tenant(self, name: str, **fields: Any) -> str:
        """Create a tenant with one key over the admin API; returns the key."""
        with self.admin() as admin:
            created = admin.post("/admin/api/tenants", json={"name": name, **fields})
            assert created.status_code == 201, created.text
            key = admin.post(f"/admin/api/tenants/{name}/keys", json={})
            assert key.status_code == 201, key.text
        self.keys[name] = key.json()["secret"]
        return self.keys[name]

    def engine_stats(self) -> dict[str, Any]:
        with self.admin() as admin:
            return admin.get("/admin/api/engine").json()["stats"]  # type: ignore[no-any-return]

    def ledger(self, where: str, **params: Any) -> list[dict[str, Any]]:
        """Ledger rows matching a SQL condition, read from the server's SQLite file."""
        engine = create_engine(default_db_url(self.data_dir))
        try:
            with engine.connect() as conn:
                return [
                    dict(r)
                    for r in conn.execute(text(f"SELECT * FROM usage WHERE {where}"), params).mappings()
                ]
        finally:
            engine.dispose()

    def ledger_rows(self, n: int, where: str, **params: Any) -> list[dict[str, Any]]:
        """Wait (the ledger writes behind) until at least `n` rows match; returns them all."""
        found: list[dict[str, Any]] = wait_for(
            lambda: rows if len(rows := self.ledger(where, **params)) >= n else None,
            30,
            f"{n} ledger rows where {where} {params}",
        )
        return found


@pytest.fixture(scope="package")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    data_dir = tmp_path_factory.mktemp("client-serve")
    proc = ServeProcess(data_dir, "--max-num-seqs", "2", "--no-engine-process")
    s = Served(proc, data_dir)
    try:
        s.add_tenant("hog")
        s.add_tenant("narrow", max_queued_requests=1)
        s.add_tenant("agent")
        yield s
    finally:
        proc.stop()


class Hogs:
    """Long streams of tenant `hog` that fill both engine slots until cancelled (their task id)."""

    def __init__(self, served: Served, task_id: str, n: int = 2, max_tokens: int = 1500) -> None:
        self.served, self.task_id, self.n, self.max_tokens = served, task_id, n, max_tokens
        self.started = [threading.Event() for _ in range(n)]
        self.threads = [threading.Thread(target=self._one, args=(i,), daemon=True) for i in range(n)]

    def _one(self, i: int) -> None:
        body = {
            "model": "fairserve-tiny",
            "prompt": f"hog {i} " * 8,
            "max_tokens": self.max_tokens,
            "ignore_eos": True,
            "stream": True,
        }
        headers = {"Authorization": f"Bearer {self.served.keys['hog']}", "X-Task-Id": self.task_id}
        with (
            httpx.Client(base_url=self.served.url, timeout=120) as c,
            c.stream("POST", "/v1/completions", json=body, headers=headers) as resp,
        ):
            for _ in resp.iter_lines():
                self.started[i].set()
        self.started[i].set()

    def cancel(self) -> None:
        with httpx.Client(base_url=self.served.url, timeout=30) as c:
            c.post(
                f"/v1/tasks/{self.task_id}/cancel",
                headers={"Authorization": f"Bearer {self.served.keys['hog']}"},
            )

    def __enter__(self) -> Hogs:
        for t in self.threads:
            t.start()
        for e in self.started:
            assert e.wait(60), "hog stream did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()
        for t in self.threads:
            t.join(60)


def on_response(status: int, action: Callable[[], None]) -> Callable[[Any], None]:
    """An httpx event hook that runs `action` once, at the first response with `status`."""
    done = threading.Event()

    def hook(response: Any) -> None:
        if response.status_code == status and not done.is_set():
            done.set()
            action()

    return hook
