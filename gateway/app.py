"""The ASGI app factory: routes, edge middleware, error rendering, startup and graceful drain."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from functools import partial

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response

from billing import Tenant
from engine import EngineClient
from engine.serving.remote.client import RemoteEngine
from gateway.adapters import keep_adapters_fresh
from gateway.admin import routes as admin_routes
from gateway.admin.live import keep_share_history, runtime_of
from gateway.edge.errors import APIError, error_response
from gateway.edge.middleware import EdgeMiddleware
from gateway.engine_health import process_engines
from gateway.openai import cancel as cancel_routes
from gateway.openai import routes as openai_routes
from gateway.openai.door import refuse_at_door
from gateway.ops import routes as ops_routes
from gateway.ops.engine_watch import keep_engine_alive
from gateway.ops.logs import AccessLog
from gateway.ops.loop_watch import RouteNamedTasks, watch_loop
from gateway.ops.produced import confirm, keep_engines_billed, remote_engines
from gateway.prefixes import keep_prefixes_fresh
from gateway.settings import GatewaySettings
from gateway.state import GatewayState, build_state, close_state
from gateway.tenant_watch import keep_tenants_current
from routing import EngineRouter, ModelRouter

log = logging.getLogger(__name__)


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    return error_response(exc)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return error_response(APIError(exc.status_code, str(exc.detail), code, headers=exc.headers))


async def _server_error(request: Request, exc: Exception) -> Response:
    # Logged with its traceback here; the client only learns that it was our fault.
    log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(APIError(500, "internal server error", "internal_error"))


async def drain(state: GatewayState, grace_s: float) -> None:
    """Stop admitting, let in-flight runs finish for `grace_s`, then cancel what is left."""
    state.draining = True
    started = time.monotonic()
    log.info("draining: %d requests in flight, up to %.0f s to finish", len(state.runs.by_id), grace_s)
    if not await state.runs.wait_idle(time.monotonic() + grace_s):
        left = list(state.runs.by_id.values())
        log.warning("drain: grace period over, cancelling the %d requests left", len(left))
        for run in left:
            run.cancel("shutdown")
        await state.runs.wait_idle(time.monotonic() + 5.0)
    log.info("drained in %.1f s", time.monotonic() - started)


def _tenants_changed(app: Starlette, state: GatewayState, changed: list[Tenant]) -> None:
    """After tenants changed anywhere: metric labels and the dashboard's tenant list show them."""
    state.refresh_tenant_labels(force=True)
    runtime_of(app.state).forget_tenants()


def create_app(
    settings: GatewaySettings, engine: EngineClient | None = None, owns_engine: bool | None = None
) -> Starlette:
    """Build the gateway app; with `engine=None` it loads and starts its own engine at startup. A given
    engine is stopped with the app when `owns_engine` (`serve` starts it first, to fail fast)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if settings.loop_debug:
            watch_loop(settings.loop_budget_ms)
        state = await asyncio.to_thread(build_state, settings, engine, owns_engine)
        app.state.gateway = state
        if isinstance(
            state.engine, RemoteEngine | EngineRouter | ModelRouter
        ):  # heartbeats run on this loop from now
            state.engine.bind(asyncio.get_running_loop())
        billing = None
        if remote_engines(state.engine):  # their produced-token records: confirm and reconcile
            state.billed_ids = []
            billing = asyncio.create_task(keep_engines_billed(state))
        prefixes = asyncio.create_task(keep_prefixes_fresh(state.prefixes))
        adapters = asyncio.create_task(keep_adapters_fresh(state.adapters))
        history = asyncio.create_task(keep_share_history(app.state, state))  # the dashboard's, watched or not
        state.tenant_watch.on_change = partial(_tenants_changed, app, state)
        tenants = asyncio.create_task(
            keep_tenants_current(state.tenant_watch, settings.tenant_poll_interval_s)
        )
        watches = []  # one per worker process it started: a lone engine, or one per `--model`
        if state.owns_engine and settings.restart_engine:
            watches = [
                asyncio.create_task(keep_engine_alive(state, engine))
                for engine in process_engines(state.engine)
            ]
        try:
            yield
        finally:
            prefixes.cancel()
            adapters.cancel()
            history.cancel()
            tenants.cancel()
            for watch in watches:
                watch.cancel()
            await drain(state, settings.grace_period_s)
            if billing is not None:
                billing.cancel()
                confirm(state)
            await close_state(state)

    return Starlette(
        routes=[*openai_routes.routes, *cancel_routes.routes, *ops_routes.routes, *admin_routes.routes],
        middleware=[
            *(
                [Middleware(AccessLog)] if settings.access_log else []
            ),  # outermost: it times the whole request
            Middleware(EdgeMiddleware, max_body_bytes=settings.max_body_bytes, early=refuse_at_door),
            *([Middleware(RouteNamedTasks)] if settings.loop_debug else []),  # inside: the request id is set
            Middleware(openai_routes.GenerationRoutes),
        ],
        exception_handlers={APIError: _api_error, HTTPException: _http_error, Exception: _server_error},
        lifespan=lifespan,
    )
