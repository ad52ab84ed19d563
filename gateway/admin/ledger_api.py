"""Admin API of the ledger itself: the rows the database refused (quarantine), and requeueing them."""

from __future__ import annotations

from datetime import UTC, datetime

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.admin.api import _when
from gateway.cli.arg_types import parse_since
from gateway.ops import produced
from gateway.state import GatewayState


async def quarantine(request: Request, state: GatewayState) -> Response:
    """GET /admin/api/ledger/quarantine[?limit=N]: each refused row with the database's reason."""
    limit = request.query_params.get("limit", "100")
    count = int(limit) if limit.isdigit() else 100
    entries = await run_in_threadpool(state.ledger.quarantine.entries, min(count, 1000))
    return JSONResponse({"count": state.ledger.quarantine.count, "rows": entries})


async def requeue(request: Request, state: GatewayState) -> Response:
    """POST /admin/api/ledger/quarantine/requeue: store the quarantined rows the database now accepts."""
    stored, refused = await run_in_threadpool(state.ledger.requeue_quarantined)
    return JSONResponse({"stored": stored, "still_refused": refused, "count": state.ledger.quarantine.count})


async def reconcile(request: Request, state: GatewayState) -> Response:
    """GET /admin/api/ledger/reconcile?since=24h: the ledger against the attached engines' own
    per-tenant counters since the start of that hour, with every difference (`fairserve usage reconcile`)."""
    now = datetime.now(UTC)
    since = _when(request, "since", now) or parse_since("24h", now)
    return JSONResponse(await produced.reconcile(state, since))
