"""Operational routes: Prometheus metrics (behind the metrics or admin token), liveness, readiness.

/healthz and /readyz stay open for load balancers and carry no tenant data; /metrics names tenants.
"""

from __future__ import annotations

import os

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.edge.auth import check_metrics
from gateway.state import GatewayState
from routing import engine_loads


async def metrics(request: Request) -> Response:
    """GET /metrics: needs `Authorization: Bearer <metrics_token or admin_token>`.

    Written on a worker thread: with 50 labelled tenants one exposition is tens of milliseconds of CPU,
    which on the event loop's thread would stall every stream once per scrape; on a thread the loop takes
    the GIL back every switch interval. The collectors already serve `--metrics-port`'s thread the same way.
    """
    state: GatewayState = request.app.state.gateway
    check_metrics(request, state.metrics_token, state.admin_token)
    await run_in_threadpool(state.refresh_tenant_labels)
    body = await run_in_threadpool(generate_latest, state.metrics.registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


async def healthz(request: Request) -> JSONResponse:
    """GET /healthz: the process answers; `pid` says which of `serve --workers N` did (no tenant data)."""
    return JSONResponse({"status": "ok", "pid": os.getpid()})


async def readyz(request: Request) -> JSONResponse:
    """GET /readyz: 200 when some model's engine is up, the database answers and the gateway admits.

    `engines` lists each engine (key, model, up): with several models, one model's engine down leaves the
    gateway ready (its requests get 503 `engine_unavailable`), and this says which.
    `degraded` names optional dependencies that are away (Redis), and `ledger` while rows are quarantined;
    they do not make the gateway unready.
    """
    state: GatewayState = request.app.state.gateway
    ok, checks = await run_in_threadpool(state.ready)
    # Alive but silent past the heartbeat bound: still serving (their requests keep running), shown apart.
    suspect = [load.key for load in engine_loads(state.engine) if load.suspect]
    dependencies = await state.dependencies()
    degraded = sorted(name for name, dep in dependencies.items() if dep["state"] != "closed")
    # Quarantined ledger rows (refused by the database) need an operator, not a restart: degraded, ready.
    quarantined = state.ledger.quarantine.count
    if quarantined:
        degraded.append("ledger")
    return JSONResponse(
        {
            "ready": ok,
            "checks": checks,
            "engines": state.engine_health.report(state.engine),
            "suspect_engines": suspect,
            "degraded": degraded,
            "dependencies": dependencies,
            "ledger": "degraded" if quarantined else "ok",
            "quarantined_rows": quarantined,
        },
        status_code=200 if ok else 503,
    )


routes = [
    Route("/metrics", metrics, methods=["GET"]),
    Route("/healthz", healthz, methods=["GET"]),
    Route("/readyz", readyz, methods=["GET"]),
]
