"""The ASGI app factory: routes, edge middleware, error rendering, startup and graceful drain."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response

from engine import EngineClient
from engine.remote.client import RemoteEngine
from gateway.adapters import keep_adapters_fresh
from gateway.admin import routes as admin_routes
from gateway.admin.live import keep_share_history
from gateway.edge.errors import APIError, error_response
from gateway.edge.middleware import EdgeMiddleware
from gateway.engine_health import process_engines
from gateway.openai import cancel as cancel_routes
from gateway.openai import routes as openai_routes
from gateway.openai.generation import refuse_spent_tenant
from gateway.ops import routes as ops_routes
from gateway.ops.engine_watch import keep_engine_alive
from gateway.ops.loop_watch import RouteNamedTasks, watch_loop
from gateway.ops.produced import confirm, keep_engines_billed, remote_engines
from gateway.prefixes import keep_prefixes_fresh
from gateway.settings import GatewaySettings
from gateway.state import GatewayState, build_state, close_state
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
    if not await state.runs.wait_idle(time.monotonic() + grace_s):
        for run in list(state.runs.by_id.values()):
            run.cancel("shutdown")
        await state.runs.wait_idle(time.monotonic() + 5.0)


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
            Middleware(EdgeMiddleware, max_body_bytes=settings.max_body_bytes, early=refuse_spent_tenant),
            *([Middleware(RouteNamedTasks)] if settings.loop_debug else []),  # inside: the request id is set
            Middleware(openai_routes.GenerationRoutes),
        ],
        exception_handlers={APIError: _api_error, HTTPException: _http_error, Exception: _server_error},
        lifespan=lifespan,
    )
