"""A report costs the same whatever the task holds (issue 54, point 5), over real HTTP, on SQLite and
PostgreSQL: a task with thousands of distinct X-Attempt values is reported with the totals its rows say,
by one SELECT that reads one row of the rollup; and a tenant that keeps polling while told to wait is held
with `too_many_reports`, alone."""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, event

from billing.ledger_sql import write_batch
from billing.records import UsageRecord
from engine import AsyncEngine
from gateway.settings import GatewaySettings
from tests.billing.conftest import pg_url  # noqa: F401  (the fixture: a fresh PostgreSQL database)
from tests.billing.test_ledger import make_row
from tests.billing.test_task_rollup import OUTCOMES, expected_report
from tests.gateway.conftest import Server, start_server

ATTEMPTS = 5_000  # distinct attempts of the big task: the old rollup read one row per attempt and outcome


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_gateway(
    request: pytest.FixtureRequest, server: Server, tmp_path: Path, gateway: Callable[..., Server]
) -> Iterator[Server]:
    """A gateway on the suite's engine with its ledger on SQLite (the suite's) or on PostgreSQL."""
    if request.param == "sqlite":
        yield gateway()
        return
    url = request.getfixturevalue("pg_url")
    engine = server.state.engine
    assert isinstance(engine, AsyncEngine)
    settings = GatewaySettings(data_dir=tmp_path, db_url=url, port=0, engine=engine.config)
    srv = start_server(settings, engine)
    try:
        yield srv
    finally:
        srv.stop()


def _task_rows(tenant: str, task: str, run: str, attempts: int, seed: int) -> list[UsageRecord]:
    """One row per attempt, every outcome, the highest completed attempt somewhere in the middle of the
    list (so the rollup sees a lower one after it); a few attempts with a second row."""
    rng = random.Random(seed)
    rows = []
    for attempt in range(attempts):
        status, reason = rng.choice(OUTCOMES)
        rows.append(
            replace(
                make_row(attempt),
                request_id=f"{task}-{attempt}",
                tenant_id=tenant,
                task_id=task,
                workflow_run_id=run if attempt % 2 else None,
                attempt=attempt,
                status=status,
                finish_reason=reason,
                tokens_after_cancel=rng.randrange(5) if status == "cancelled" else 0,
            )
        )
    rows += [replace(r, request_id=r.request_id + "-again") for r in rows[: attempts // 10]]
    rng.shuffle(rows)
    return rows


class _Selects:
    """The SELECTs that read the task rollup or the usage rows, as the database was sent them."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.seen: list[tuple[str, Any]] = []

    def __call__(self, conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT") and " usage" in statement:
            self.seen.append((statement, parameters))

    def __enter__(self) -> _Selects:
        event.listen(self.engine, "before_cursor_execute", self)
        return self

    def __exit__(self, *exc: object) -> None:
        event.remove(self.engine, "before_cursor_execute", self)


def _rows_read(engine: Engine, statement: str, parameters: Any) -> int | None:
    """Rows the database read to answer the statement: PostgreSQL's EXPLAIN ANALYZE (rows the scans
    returned and removed); on SQLite, 1 when the plan is a search of the rollup's whole primary key (a
    unique key: at most one row), else None."""
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            driver = conn.connection.driver_connection
            assert driver is not None
            with driver.cursor() as cur:
                cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, parameters)
                plan = cur.fetchone()[0][0]["Plan"]
            return _scanned(plan)
        detail = " ".join(
            str(r[-1]) for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, parameters)
        )
        whole_key = (
            "SEARCH usage_scope_totals USING INDEX sqlite_autoindex_usage_scope_totals_1 "
            "(tenant_id=? AND kind=? AND scope_id=?)"
        )
        return 1 if detail == whole_key else None


def _scanned(plan: dict[str, Any]) -> int:
    own = plan["Actual Rows"] * plan.get("Actual Loops", 1) + plan.get("Rows Removed by Filter", 0)
    return int(own) + sum(_scanned(p) for p in plan.get("Plans", []))


def test_a_report_of_many_attempts_reads_one_row(ledger_gateway: Server, server: Server) -> None:
    srv = ledger_gateway
    tenant = f"many-{uuid.uuid4().hex[:6]}"
    srv.add_tenant(tenant)
    tenant_id = srv.tenants[tenant].id
    big, small, run = (
        f"big-{uuid.uuid4().hex[:6]}",
        f"small-{uuid.uuid4().hex[:6]}",
        f"run-{uuid.uuid4().hex[:6]}",
    )
    rows = _task_rows(tenant_id, big, run, ATTEMPTS, seed=54) + _task_rows(tenant_id, small, run, 1, seed=5)
    # The same ids under another tenant: never in this tenant's report.
    rows += [replace(r, tenant_id="someone-else") for r in _task_rows(tenant_id, big, run, 50, seed=6)]
    for start in range(0, len(rows), 500):  # batches of the ledger writer's size, in a shuffled order
        write_batch(srv.state.db.engine, rows[start : start + 500])

    with httpx.Client(base_url=srv.url, timeout=60) as client, _Selects(srv.state.db.engine) as selects:
        answers = {}
        for kind, ident in (("task", big), ("task", small), ("workflow_run", run)):
            path = f"/v1/tasks/{ident}" if kind == "task" else f"/v1/workflow-runs/{ident}"
            answer = client.get(path, headers=srv.headers(tenant))
            assert answer.status_code == 200, answer.text
            answers[ident] = answer.json()

    for ident, kind in ((big, "task"), (small, "task"), (run, "run")):
        want = expected_report(rows, tenant_id, kind, ident)
        assert want is not None
        got = answers[ident]
        assert {k: got[k] for k in asdict(want)} == asdict(want), ident
        assert got["wasted_tokens"] == want.wasted_tokens
    assert answers[big]["attempts"] == ATTEMPTS and answers[small]["attempts"] == 1
    assert answers[big]["replaced_tokens"] > 0  # the comparison covered a retry's replaced answers

    assert len(selects.seen) == 3, selects.seen  # one statement per report, whatever the task holds
    assert len({statement for statement, _ in selects.seen}) == 1
    for statement, parameters in selects.seen:
        assert "usage_scope_totals" in statement and "FROM usage " not in statement, statement
        assert _rows_read(srv.state.db.engine, statement, parameters) == 1, json.dumps(str(parameters))


def test_a_tenant_that_ignores_its_429s_is_held_alone(gateway: Callable[..., Server], server: Server) -> None:
    """Counting answers, not time: one report a burst, a refill of one per 20 s (so every refusal below
    falls inside the first one's Retry-After window), and a hold after 2 refusals ignored in it."""
    srv = gateway(report_burst=1, report_rate_per_s=0.05, report_hold_after=2, report_hold_s=60)
    poller = f"ignorer-{uuid.uuid4().hex[:6]}"
    server.add_tenant(poller)
    task = f"held-{uuid.uuid4().hex[:8]}"
    with httpx.Client(base_url=srv.url, timeout=60) as client:
        first = client.get(f"/v1/tasks/{task}", headers=srv.headers(poller))
        assert first.status_code == 404  # the burst: answered (an unknown id)
        told = [client.get(f"/v1/tasks/{task}", headers=srv.headers(poller)) for _ in range(3)]
        assert [r.status_code for r in told] == [429, 429, 429], [r.text for r in told]
        assert all(r.json()["error"]["code"] == "too_many_reports" for r in told)
        waits = [int(r.headers["Retry-After"]) for r in told]
        assert all(1 <= w <= 20 for w in waits), waits  # the bucket's wait: no hold yet
        assert all(r.headers.get("connection") == "close" for r in told)  # answered at the edge

        held = client.get(f"/v1/workflow-runs/{task}", headers=srv.headers(poller))  # the third ignored
        assert held.status_code == 429 and held.json()["error"]["code"] == "too_many_reports"
        assert int(held.headers["Retry-After"]) > 40, held.headers  # the hold, not the bucket
        assert "held" in held.json()["error"]["message"]
        again = client.get(f"/v1/tasks/{task}", headers=srv.headers(poller))
        assert again.status_code == 429 and int(again.headers["Retry-After"]) > 40

        other = client.get(f"/v1/tasks/{task}", headers=srv.headers("bob"))  # bob's reports are his own
        assert other.status_code == 404 and other.json()["error"]["code"] == "task_not_found"
        served = client.post(
            "/v1/completions",
            json={"model": srv.state.engine.model_name, "prompt": "hi", "max_tokens": 2},
            headers=srv.headers(poller),
        )
        assert served.status_code == 200  # the hold is on reports, not on the tenant's requests
