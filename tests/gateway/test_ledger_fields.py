"""Every header and body field that reaches the ledger, at the longest value the edge accepts, is stored.

Real HTTP (uvicorn on a free port, the real engine) on SQLite and PostgreSQL: SQLite ignores varchar
lengths, PostgreSQL refuses a longer value, so a cap wider than its column shows up there as a missing row.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path

import httpx
import pytest
from sqlalchemy import inspect

from billing import UsageRecord, default_db_url
from billing import fields as width
from engine import AsyncEngine
from gateway.settings import GatewaySettings
from tests.billing.conftest import pg_url  # noqa: F401  (the fixture, for the PostgreSQL runs)
from tests.gateway.conftest import Server, start_server

# Where each usage column comes from. A new UsageRecord field fails test_every_ledger_field_is_classified
# until it is placed here: a caller-chosen one needs a cap at the edge and a row in CALLER_FIELDS below.
FROM_CALLER = {"request_id", "task_id", "workflow_run_id", "attempt", "model"}
FROM_GATEWAY = {"tenant_id", "api_key_id", "status", "finish_reason", "cancel_state", "created_at"}
FROM_GATEWAY |= {"finished_at", "queue_ms", "ttft_ms", "e2e_ms", "charged_service"}
# The served model is a name an engine announced (the body's `model` must equal one, capped at MODEL_MAX).
FROM_GATEWAY |= {"served_model", "degradation", "dropped_tokens"}
FROM_GATEWAY |= {"counted_by_gateway"}  # an upstream engine that sent no usage (upstream/)
FROM_ENGINE = {"prompt_tokens", "cached_tokens", "completion_tokens", "tokens_after_cancel"}
FROM_ENGINE |= {"preemptions", "recomputed_tokens", "delivered_tokens"}
# Headers and body fields the edge reads that do not reach the ledger (so no column bounds them).
NOT_STORED = {"Idempotency-Key", "user", "cache_salt"}


def _longest(n: int, tag: str) -> str:
    return (tag + "-" + uuid.uuid4().hex + "x" * n)[:n]


def test_every_ledger_field_is_classified() -> None:
    stored = {f.name for f in fields(UsageRecord)}
    assert stored == FROM_CALLER | FROM_GATEWAY | FROM_ENGINE


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_server(request: pytest.FixtureRequest, engine: AsyncEngine, tmp_path: Path) -> Iterator[Server]:
    db_url = request.getfixturevalue("pg_url") if request.param == "postgresql" else default_db_url(tmp_path)
    settings = GatewaySettings(data_dir=tmp_path, port=0, engine=engine.config, db_url=db_url)
    srv = start_server(settings, engine)
    srv.add_tenant(f"fields-{uuid.uuid4().hex[:8]}")
    yield srv
    srv.stop()


def test_migrated_columns_have_the_defined_widths(ledger_server: Server) -> None:
    columns = {c["name"]: c["type"] for c in inspect(ledger_server.state.db.engine).get_columns("usage")}
    assert {
        name: getattr(columns[name], "length", None) for name in width.USAGE_STRING_WIDTHS
    } == width.USAGE_STRING_WIDTHS


def test_longest_accepted_values_are_stored(ledger_server: Server) -> None:
    srv = ledger_server
    tenant = next(iter(srv.tenants))
    assert len(srv.model) <= width.MODEL_MAX
    caller = {
        "X-Request-Id": _longest(width.REQUEST_ID_MAX, "r"),
        "X-Task-Id": _longest(width.TASK_ID_MAX, "t"),
        "X-Workflow-Run-Id": _longest(width.WORKFLOW_RUN_ID_MAX, "w"),
        "X-Attempt": "1000000",
        "Idempotency-Key": _longest(255, "k"),
    }
    body = {"model": srv.model, "prompt": "hi", "max_tokens": 3, "user": "u" * 64}
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        for longer in ("X-Task-Id", "X-Workflow-Run-Id"):  # one more character is refused, naming the header
            bad = c.post(
                "/v1/completions",
                json=body,
                headers=srv.headers(tenant, **{longer: "x" * (width.TASK_ID_MAX + 1)}),
            )
            assert bad.status_code == 400 and bad.json()["error"]["param"].lower() == longer.lower()
        long_model = c.post(
            "/v1/completions",
            json={**body, "model": "m" * (width.MODEL_MAX + 1)},
            headers=srv.headers(tenant),
        )
        assert long_model.status_code == 400 and long_model.json()["error"]["param"] == "model"
        too_long_id = "r" * (width.REQUEST_ID_MAX + 1)  # refused as task ids are, never stored
        refused = c.post(
            "/v1/completions", json=body, headers=srv.headers(tenant, **{"X-Request-Id": too_long_id})
        )
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "x-request-id"
        resp = c.post("/v1/completions", json=body, headers=srv.headers(tenant, **caller))
        assert resp.status_code == 200, resp.text
        assert resp.headers["x-request-id"] == caller["X-Request-Id"]
    rows = srv.usage_rows("request_id = :rid", rid=caller["X-Request-Id"])
    assert len(rows) == 1
    row = rows[0]
    assert row["task_id"] == caller["X-Task-Id"]
    assert row["workflow_run_id"] == caller["X-Workflow-Run-Id"]
    assert row["attempt"] == 1_000_000
    assert row["model"] == srv.model
    registry = srv.state.metrics.registry
    assert registry.get_sample_value("fairserve_ledger_rejected_rows_total") == 0
