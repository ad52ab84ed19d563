"""Task telemetry routes: a tenant reads what its own task or workflow run cost; other tenants' ids are 404.

GET /v1/tasks/{task_id} and GET /v1/workflow-runs/{run_id} answer from the ledger (billing/tasks.py):
attempts, requests completed / cancelled / ended by deadline / rejected for an infeasible deadline, engine
tokens, tokens computed after a cancel, and wasted tokens split into cancelled branches and attempts whose
answer a retry replaced. The ledger writes behind the request path, so the last rows may take a moment.

A report reads one row of the ledger's rollup (billing/tasks.py) whatever the task holds, by a key that
begins with the tenant. Each tenant may read `report_burst` reports at once and `report_rate_per_s` after
that (a token bucket per tenant, as for refusals); past it, 429 `too_many_reports` + Retry-After before
any query, at the edge when the key is cached (`refuse_polling_tenant`, held up to a second as the door's
`too_many_refusals` is). A tenant that sends more than `report_hold_after` reports inside one Retry-After
window is held for `report_hold_s`: a tenant polling in a loop spends its own budget, not the server's.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
import uuid

from sqlalchemy.exc import SQLAlchemyError
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import Scope

from admission.controller import Rejection
from billing.tasks import INFEASIBLE, TaskReport
from gateway.edge.auth import PEEKED_KEY, authenticate
from gateway.edge.errors import APIError
from gateway.openai.context import RequestContext
from gateway.openai.parsing import request_headers
from gateway.openai.refusals import refused
from gateway.openai.runs import Outcome
from gateway.state import GatewayState

log = logging.getLogger("fairserve.gateway.tasks")
REPORT_PATHS = ("/v1/tasks/", "/v1/workflow-runs/")  # the report routes' prefixes (POST .../cancel aside)
_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,200}$")  # the X-Task-Id alphabet, less "/" (a path separator)


def record_infeasible(state: GatewayState, ctx: RequestContext, rejection: Rejection) -> None:
    """A ledger row for a task's or workflow run's request refused for an infeasible deadline.

    Zero tokens, status "rejected", finish_reason "infeasible", under an id of its own ("refused-...") so
    the request's id stays free for its retry. Only requests that name a task or run get one: the row is
    there for their report.
    """
    infeasible = rejection.code in ("deadline_infeasible", "deadline_unmeetable")
    if not infeasible or not (ctx.ident.task_id or ctx.ident.workflow_run_id):
        return
    state.metrics.tasks.infeasible(ctx.tenant_id)
    row = ctx.usage_record(Outcome("rejected", None, None, None), time.time())
    row = dataclasses.replace(row, request_id=f"refused-{uuid.uuid4().hex[:24]}", finish_reason=INFEASIBLE)
    try:
        state.ledger.record(row)
    except Exception:  # the ledger spills on its own; a full buffer must not change the refusal
        log.warning("ledger refused row %s", row.request_id, exc_info=True)


def _spent(state: GatewayState, tenant_id: str, kind: str) -> APIError | None:
    """429 `too_many_reports` (counted) while the tenant's report budget is spent, with the longer
    Retry-After of a hold once it has ignored too many of them (gateway/edge/auth_guard.py `refused`)."""
    wait = state.reports.retry_after(tenant_id)
    if wait is None:
        return None
    wait = state.reports.refused(tenant_id, wait)
    if state.reports.held(tenant_id):
        message = f"{kind} reports from this tenant are held for {wait} s: it kept polling while told to wait"
    else:
        message = (
            f"too many {kind} reports from this tenant; poll at most {state.reports.rate_per_s:g} a second"
        )
    err = APIError(429, message, "too_many_reports", headers={"Retry-After": str(wait)})
    return refused(state, tenant_id, err)


def refuse_polling_tenant(scope: Scope) -> APIError | None:
    """The edge's check before routing (EdgeMiddleware `early`, gateway/openai/door.py): a report GET whose
    key is in the cache and whose tenant has spent its report budget is refused there, held up to a
    second and its connection closed, so a poller that ignores Retry-After costs a sleeping coroutine, not
    a request's routing and authentication, each time."""
    path: str = scope.get("path", "")
    prefix = next((p for p in REPORT_PATHS if path.startswith(p)), None)
    if scope["method"] != "GET" or prefix is None or "/" in path[len(prefix) :]:
        return None  # not a report (a cancel's path has one more segment)
    state: GatewayState | None = getattr(scope["app"].state, "gateway", None)
    token = request_headers(scope).bearer if state is not None else None
    if state is None or token is None:
        return None
    generation = state.keys.generation
    found = state.keys.peek(token)[1]
    if found is None:
        return None
    scope[PEEKED_KEY] = (token, found, generation)  # `authenticate` takes the cached key from here
    return _spent(state, found[0].id, "task" if prefix == REPORT_PATHS[0] else "workflow_run")


async def _report(request: Request, field: str, kind: str) -> JSONResponse:
    state: GatewayState = request.app.state.gateway
    caller = await authenticate(request, state.keys, state.auth_budget, state.metrics.auth_failures)
    ident = request.path_params[field]
    if not _ID.match(ident):
        raise APIError(
            400, f"{field} must be 1-200 characters of letters, digits and ._:-", "invalid_value", field
        )
    spent = _spent(state, caller.tenant.id, kind)
    if spent is not None:
        raise spent
    state.reports.charge(caller.tenant.id)
    scope = {"task_id": ident} if kind == "task" else {"workflow_run_id": ident}
    try:
        report: TaskReport | None = await run_in_threadpool(
            state.store.task_report, caller.tenant.id, **scope
        )
    except SQLAlchemyError:
        log.warning("task report for %s failed", ident, exc_info=True)
        raise APIError(503, "the ledger is unavailable; retry shortly", "ledger_unavailable") from None
    if report is None:  # never seen, or another tenant's: the same answer, so ids cannot be probed
        raise APIError(404, f"no ledger rows for {kind} {ident!r}", f"{kind}_not_found", field)
    body = {"id": ident, "object": kind, **dataclasses.asdict(report), "wasted_tokens": report.wasted_tokens}
    return JSONResponse(body)


async def get_task(request: Request) -> JSONResponse:
    """GET /v1/tasks/{task_id}: the caller's task, from the ledger."""
    return await _report(request, "task_id", "task")


async def get_workflow_run(request: Request) -> JSONResponse:
    """GET /v1/workflow-runs/{run_id}: the caller's workflow run (X-Workflow-Run-Id), from the ledger."""
    return await _report(request, "run_id", "workflow_run")


routes = [
    Route("/v1/tasks/{task_id}", get_task, methods=["GET"]),
    Route("/v1/workflow-runs/{run_id}", get_workflow_run, methods=["GET"]),
]
