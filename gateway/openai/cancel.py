"""Cancellation routes: a tenant cancels its own requests or tasks; other tenants' ids are 404."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gateway.edge.auth import authenticate
from gateway.edge.errors import APIError
from gateway.state import GatewayState


async def cancel_request(request: Request) -> JSONResponse:
    """POST /v1/requests/{request_id}/cancel."""
    state: GatewayState = request.app.state.gateway
    caller = await authenticate(request, state.keys, state.auth_budget, state.metrics.auth_failures)
    request_id = request.path_params["request_id"]
    run = state.runs.owned(caller.tenant.id, request_id)
    if run is None:
        raise APIError(404, f"no live request {request_id!r}", "request_not_found", "request_id")
    run.cancel("api")
    return JSONResponse(
        {"id": request_id, "object": "request.cancel", "cancelled": True, "started": run.started}
    )


async def cancel_task(request: Request) -> JSONResponse:
    """POST /v1/tasks/{task_id}/cancel: every live request of the tenant with that X-Task-Id."""
    state: GatewayState = request.app.state.gateway
    caller = await authenticate(request, state.keys, state.auth_budget, state.metrics.auth_failures)
    task_id = request.path_params["task_id"]
    runs = state.runs.of_task(caller.tenant.id, task_id)
    if not runs:
        raise APIError(404, f"no live requests for task {task_id!r}", "task_not_found", "task_id")
    for run in runs:
        run.cancel("api")
    return JSONResponse(
        {"task_id": task_id, "object": "task.cancel", "cancelled": sorted(r.spec.request_id for r in runs)}
    )


routes = [
    Route("/v1/requests/{request_id}/cancel", cancel_request, methods=["POST"]),
    Route("/v1/tasks/{task_id}/cancel", cancel_task, methods=["POST"]),
]
