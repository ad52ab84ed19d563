"""Shared plumbing of the admin API: the admin-token guard, JSON bodies, query values, store errors."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import asdict, is_dataclass
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy.exc import SQLAlchemyError
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from billing import KeyNotFound, StoreUnavailable, TenantExists, TenantNotFound
from gateway.edge.auth import check_admin
from gateway.edge.errors import APIError
from gateway.state import GatewayState

log = logging.getLogger(__name__)
T = TypeVar("T")
AdminHandler = Callable[[Request, GatewayState], Awaitable[Response]]
ACTOR_HEADER = "x-admin-actor"
MAX_ACTOR_LENGTH = 64
# Admin answers carry secrets (new keys) and per-tenant data: never cache them anywhere.
NO_STORE = {"Cache-Control": "no-store"}


def admin_endpoint(handler: AdminHandler) -> Callable[[Request], Awaitable[Response]]:
    """Wrap a handler so it runs only for the admin token (401 without one, 403 for any other)."""

    async def endpoint(request: Request) -> Response:
        state: GatewayState = request.app.state.gateway
        check_admin(request, state.admin_token)
        return await handler(request, state)

    endpoint.__name__ = handler.__name__
    endpoint.__doc__ = handler.__doc__
    return endpoint


def jsonable(value: Any) -> Any:
    """Dataclasses, datetimes and containers as JSON-ready values (datetimes as ISO 8601 UTC)."""
    if is_dataclass(value) and not isinstance(value, type):
        return jsonable(asdict(value))
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def reply(payload: Any, status: int = 200) -> JSONResponse:
    """A JSON answer that no cache keeps."""
    return JSONResponse(jsonable(payload), status_code=status, headers=NO_STORE)


async def json_object(request: Request) -> dict[str, Any]:
    """The request body as a JSON object ({} when empty); 400 `invalid_json` otherwise."""
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise APIError(400, "request body is not valid JSON", "invalid_json") from None
    if not isinstance(body, dict):
        raise APIError(400, "request body must be a JSON object", "invalid_json")
    return body


def actor(request: Request) -> str:
    """Who to record in the audit log: `admin`, or `admin:<name>` from the X-Admin-Actor header."""
    name = request.headers.get(ACTOR_HEADER, "").strip()
    if not name:
        return "admin"
    if len(name) > MAX_ACTOR_LENGTH or not name.isprintable():
        raise APIError(
            400,
            f"X-Admin-Actor must be at most {MAX_ACTOR_LENGTH} printable characters",
            "invalid_value",
            "X-Admin-Actor",
        )
    return f"admin:{name}"


def query_int(request: Request, name: str, default: int, lo: int, hi: int) -> int:
    """An integer query parameter in [lo, hi]; 400 naming it otherwise."""
    text = request.query_params.get(name)
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise APIError(400, f"{name} must be an integer, got {text!r}", "invalid_value", name) from None
    if not lo <= value <= hi:
        raise APIError(400, f"{name} must be in {lo}..{hi}, got {value}", "invalid_value", name)
    return value


async def in_store(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a blocking BillingStore call off the event loop, mapping its errors to HTTP statuses."""
    try:
        return await run_in_threadpool(fn, *args, **kwargs)
    except TenantNotFound as exc:
        raise APIError(404, str(exc), "tenant_not_found") from None
    except KeyNotFound as exc:
        raise APIError(404, str(exc), "key_not_found") from None
    except TenantExists as exc:
        raise APIError(409, str(exc), "tenant_exists", "name") from None
    except ValueError as exc:
        raise APIError(400, str(exc), "invalid_value") from None
    except (StoreUnavailable, SQLAlchemyError):
        log.warning("admin API: billing store call %s failed", getattr(fn, "__name__", fn), exc_info=True)
        raise APIError(
            503, "the billing database is unavailable", "store_unavailable", headers={"Retry-After": "1"}
        ) from None
