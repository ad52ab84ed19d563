"""Admin surface: the `/admin` dashboard (static, served locally) and `/admin/api/*` behind the admin token."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from gateway.admin import adapters, api, ledger_api, live, prefixes
from gateway.admin.http import AdminHandler, admin_endpoint
from gateway.admin.live import engine_rows
from gateway.state import GatewayState

STATIC_DIR = Path(__file__).parent / "static"
# The page loads only its own files and talks only to this origin; the token lives in JS memory and
# sessionStorage, so no inline script or third-party origin may run next to it.
PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


async def admin_page(request: Request) -> Response:
    """GET /admin: the dashboard; it asks for the admin token itself (the page holds no data)."""
    return FileResponse(STATIC_DIR / "index.html", media_type="text/html", headers=PAGE_HEADERS)


async def engine_state(request: Request, state: GatewayState) -> Response:
    """GET /admin/api/engine: the raw engine statistics."""
    return JSONResponse(
        {
            "model": state.engine.model_name,
            "stats": asdict(state.engine.stats()),
            "live_requests": len(state.runs.by_id),
            "draining": state.draining,
        }
    )


async def engines(request: Request, state: GatewayState) -> Response:
    """GET /admin/api/engines: each engine's health, load and the requests routed to it (a gateway's only
    engine is one entry, "local")."""
    return JSONResponse({"engines": engine_rows(state)})


def _api(path: str, handler: AdminHandler, *methods: str) -> Route:
    return Route(f"/admin/api{path}", admin_endpoint(handler), methods=list(methods))


routes: list[BaseRoute] = [
    Route("/admin", admin_page, methods=["GET"]),
    Mount("/admin/static", StaticFiles(directory=STATIC_DIR), name="admin-static"),
    _api("/engine", engine_state, "GET"),
    _api("/engines", engines, "GET"),
    _api("/live", live.live, "GET"),
    _api("/live/stream", live.live_stream, "GET"),
    _api("/tenants", api.list_tenants, "GET"),
    _api("/tenants", api.create_tenant, "POST"),
    _api("/tenants/{tenant}", api.get_tenant, "GET"),
    _api("/tenants/{tenant}", api.update_tenant, "PATCH"),
    _api("/tenants/{tenant}/disable", api.disable_tenant, "POST"),
    _api("/tenants/{tenant}/enable", api.enable_tenant, "POST"),
    _api("/tenants/{tenant}/keys", api.list_keys, "GET"),
    _api("/tenants/{tenant}/keys", api.create_key, "POST"),
    _api("/keys", api.list_keys, "GET"),
    _api("/keys/{key}/revoke", api.revoke_key, "POST"),
    _api("/usage", api.usage, "GET"),
    _api("/audit", api.audit, "GET"),
    _api("/ledger/quarantine", ledger_api.quarantine, "GET"),
    _api("/ledger/quarantine/requeue", ledger_api.requeue, "POST"),
    _api("/ledger/reconcile", ledger_api.reconcile, "GET"),
    _api("/prefixes", prefixes.list_prefixes, "GET"),
    _api("/prefixes", prefixes.add_prefix, "POST"),
    _api("/prefixes/{ref}", prefixes.remove_prefix, "DELETE"),
    _api("/adapters", adapters.list_adapters, "GET"),
    _api("/adapters", adapters.add_adapter, "POST"),
    _api("/adapters/{name}", adapters.remove_adapter, "DELETE"),
]
