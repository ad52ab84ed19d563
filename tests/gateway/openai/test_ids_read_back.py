"""Ids accepted at the edge can always be read back (#45): an X-Task-Id or X-Workflow-Run-Id that its
route could not read ("/", ".", "..") is refused with 400 naming the header; every accepted one is read
back through GET /v1/tasks/{id} and /v1/workflow-runs/{id}. Real HTTP, real engine, real SQLite ledger."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from tests.gateway.conftest import Server, wait_for


def _post(server: Server, client: httpx.Client, **headers: str) -> httpx.Response:
    body = {"model": server.model, "prompt": "ids", "max_tokens": 1}
    return client.post("/v1/completions", json=body, headers=server.headers("alice", **headers))


@pytest.mark.parametrize("header", ["X-Task-Id", "X-Workflow-Run-Id"])
@pytest.mark.parametrize("value", ["wf/1", "a/b/c", ".", ".."])
def test_an_id_its_route_could_not_read_is_refused(
    server: Server, client: httpx.Client, header: str, value: str
) -> None:
    resp = _post(server, client, **{header: value})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["code"] == "invalid_header" and error["param"] == header.lower(), error


def test_every_accepted_id_is_read_back(server: Server, client: httpx.Client) -> None:
    suffix = uuid.uuid4().hex[:8]
    task, run = f"t.{suffix}:a-b_c..", f"...run:{suffix}-x.y"  # every character the alphabet allows
    assert _post(server, client, **{"X-Task-Id": task, "X-Workflow-Run-Id": run}).status_code == 200
    for path, ident in ((f"/v1/tasks/{task}", task), (f"/v1/workflow-runs/{run}", run)):

        def report(path: str = path) -> dict[str, Any] | None:
            resp = client.get(path, headers=server.headers("alice"))
            return dict(resp.json()) if resp.status_code == 200 else None

        found = wait_for(report, 10, f"{path} to read back")
        assert found["id"] == ident and found["requests"] == 1
