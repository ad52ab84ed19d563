"""Tasks are first-class: GET /v1/tasks/{id} and /v1/workflow-runs/{id} from the ledger, the dashboard's
wasted share, and per-tenant Prometheus totals. Real HTTP, real engine, real SQLite ledger."""

from __future__ import annotations

import re
import threading
import uuid
from typing import Any

import httpx

from tests.gateway.conftest import Server, wait_for


def _post(
    server: Server, client: httpx.Client, ident: dict[str, str], max_tokens: int, **headers: str
) -> httpx.Response:
    body = {"model": server.model, "prompt": "one task", "max_tokens": max_tokens, "ignore_eos": True}
    return client.post("/v1/completions", json=body, headers=server.headers("alice", **ident, **headers))


def _cancelled_branch(server: Server, client: httpx.Client, ident: dict[str, str]) -> None:
    """A long attempt of the task, cancelled through POST /v1/tasks/{id}/cancel while it runs."""
    done = threading.Event()

    def run() -> None:
        with httpx.Client(base_url=server.url, timeout=60) as c:
            _post(server, c, ident, 400, **{"X-Attempt": "2", "X-Request-Id": ident["X-Task-Id"] + "-branch"})
        done.set()

    thread = threading.Thread(target=run)
    thread.start()
    eid = server.engine_id("alice", ident["X-Task-Id"] + "-branch")
    wait_for(lambda: (i := server.state.engine.live_request(eid)) is not None and i.state == "running", 20)
    cancel = client.post(f"/v1/tasks/{ident['X-Task-Id']}/cancel", headers=server.headers("alice"))
    assert cancel.status_code == 200
    thread.join(30)
    assert done.is_set()


def _engine_tokens(row: Any) -> int:
    return int(row["prompt_tokens"] - row["cached_tokens"] + row["completion_tokens"])


def _metric(text: str, name: str, **labels: str) -> float:
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        match = re.match(rf"^{name}\{{(.*)\}} (\S+)$", line)
        if match and ",".join(sorted(match.group(1).split(","))) == wanted:
            return float(match.group(2))
    return 0.0


def test_a_task_reports_attempts_outcomes_and_waste(server: Server, client: httpx.Client) -> None:
    task, run = f"task-{uuid.uuid4().hex[:8]}", f"run-{uuid.uuid4().hex[:8]}"
    ident = {"X-Task-Id": task, "X-Workflow-Run-Id": run}
    scrape = {"Authorization": f"Bearer {server.state.metrics_token}"}
    before = client.get("/metrics", headers=scrape).text
    first = _post(server, client, ident, 6, **{"X-Attempt": "0", "X-Request-Id": task + "-0"})
    retry = _post(server, client, ident, 6, **{"X-Attempt": "1", "X-Request-Id": task + "-1"})
    assert first.status_code == 200 and retry.status_code == 200
    _cancelled_branch(server, client, ident)
    late = _post(server, client, ident, 300, **{"X-Attempt": "3", "X-Timeout-Ms": "1"})
    assert late.status_code == 400 and late.json()["error"]["code"] == "deadline_unmeetable"

    rows = {r["request_id"]: r for r in server.usage_rows("task_id = :t", t=task)}
    assert len(rows) == 4  # the refusal has a row of its own id, so its X-Request-Id stays free
    report = wait_for(
        lambda: (
            (r := client.get(f"/v1/tasks/{task}", headers=server.headers("alice"))).status_code == 200
            and r.json()
        ),
        10,
        "the task report",
    )
    branch = rows[task + "-branch"]
    assert branch["status"] == "cancelled"
    assert report["attempts"] == 4 and report["requests"] == 4
    assert (report["completed"], report["cancelled"], report["rejected_infeasible"]) == (2, 1, 1)
    assert report["replaced_tokens"] == _engine_tokens(rows[task + "-0"]) > 0
    assert report["cancelled_tokens"] == _engine_tokens(branch)
    assert report["tokens_after_cancel"] == branch["tokens_after_cancel"]
    assert report["wasted_tokens"] == report["replaced_tokens"] + report["cancelled_tokens"]
    by_run = client.get(f"/v1/workflow-runs/{run}", headers=server.headers("alice")).json()
    assert {k: by_run[k] for k in report if k not in ("id", "object")} == {
        k: v for k, v in report.items() if k not in ("id", "object")
    }

    # Owner-only: another tenant gets the 404 of an unknown id; a malformed id is a 400 naming the field.
    other = client.get(f"/v1/tasks/{task}", headers=server.headers("bob"))
    assert other.status_code == 404 and other.json()["error"]["code"] == "task_not_found"
    bad = client.get("/v1/tasks/" + "x" * 201, headers=server.headers("alice"))
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "task_id"

    # Prometheus: per-tenant totals, no task label.
    after = client.get("/metrics", headers=scrape).text
    assert task not in after
    for kind, want in (("replaced", report["replaced_tokens"]), ("cancelled", report["cancelled_tokens"])):
        grown = _metric(after, "fairserve_task_wasted_tokens_total", tenant="alice", kind=kind) - _metric(
            before, "fairserve_task_wasted_tokens_total", tenant="alice", kind=kind
        )
        assert grown == want
    outcome = {"tenant": "alice", "outcome": "rejected_infeasible"}
    assert (
        _metric(after, "fairserve_task_requests_total", **outcome)
        - _metric(before, "fairserve_task_requests_total", **outcome)
        == 1
    )

    # The dashboard's usage shows the tenant's wasted share.
    admin = {"Authorization": f"Bearer {server.state.admin_token}"}
    usage = client.get("/admin/api/usage", params={"window": "15m"}, headers=admin).json()
    wasted = usage["wasted"][server.tenants["alice"].id]
    assert wasted["replaced_tokens"] >= report["replaced_tokens"]
    assert wasted["cancelled_tokens"] >= report["cancelled_tokens"]
    assert 0 < wasted["wasted_share"] < 1


def test_reports_are_rate_limited_per_tenant(server: Server, client: httpx.Client) -> None:
    """A tenant polling its report in a loop is answered 429 + Retry-After once its budget is spent; another
    tenant's reports are untouched. Counting answers, not time: the refill (2 a second) cannot keep up
    with a loop of back-to-back requests for long."""
    poller = f"poller-{uuid.uuid4().hex[:6]}"
    server.add_tenant(poller)
    task = f"polled-{uuid.uuid4().hex[:8]}"  # an unknown id: a 404 costs a query too
    first_429 = None
    for i in range(200):
        answer = client.get(f"/v1/tasks/{task}", headers=server.headers(poller))
        assert answer.status_code in (404, 429), answer.text
        if answer.status_code == 429:
            first_429 = (i, answer)
            break
    assert first_429 is not None, "200 back-to-back reports were all answered"
    i, refused = first_429
    assert i >= server.state.settings.report_burst  # the burst was served
    assert refused.json()["error"]["code"] == "too_many_reports"
    assert int(refused.headers["Retry-After"]) >= 1
    other = client.get(f"/v1/tasks/{task}", headers=server.headers("bob"))  # bob's budget is his own
    assert other.status_code == 404 and other.json()["error"]["code"] == "task_not_found"
