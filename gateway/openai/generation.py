"""The generation pipeline: each stage once, in order, each a function of what the one before produced.

    request_headers(scope)          -> RequestHeaders  the headers the path reads, in one pass (parsing.py)
    door(request, headers)          -> Caller          draining 503, authenticate 401/429, shed 503/429
    parse(request, caller, headers) -> RequestContext  refusal budget 429, headers and body 400, tokens
    KeyClaim(ctx)                   -> claim           Idempotency-Key: replay, attach, 422, or new (a
                                                       request without the header claims nothing: skipped)
    admit(ctx)                      -> ctx, Admission  request id 409, deadline per model (perhaps
                                                       degraded: degrade.py), queue bounds, quota
    submit(ctx, admission, claim)   -> Run             engine request, ledger row at its end (submit.py)
    respond(ctx, admission, run)    -> RunResponse     headers, then the reply as the run produces it

The claim comes before admission so a replayed or attached request spends no queue slot or quota. A
refusal raised anywhere inside the claim lets the key go (gateway/idempotency/claim.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.types import ASGIApp, Scope

from admission.controller import Rejection
from admission.edge import Admission
from gateway.edge.auth import PEEKED_KEY, Caller, authenticate_bearer
from gateway.edge.errors import APIError
from gateway.edge.middleware import TENANT_KEY
from gateway.idempotency.claim import KeyClaim
from gateway.openai import degrade
from gateway.openai.context import RequestContext, quota_limits, read_request
from gateway.openai.parsing import RequestHeaders, request_headers
from gateway.openai.refusals import quota_headers, refused, rejected
from gateway.openai.responses import RunResponse
from gateway.openai.runs import Run
from gateway.openai.submit import submit
from gateway.openai.tasks import record_infeasible
from gateway.state import GatewayState

if TYPE_CHECKING:
    from gateway.ops.tracing import RequestTrace

log = logging.getLogger(__name__)
QUOTA_STATUS_HEADER = "X-Quota-Status"  # on requests admitted while quotas could not be enforced


async def generation(request: Request, chat: bool, caller: Caller | None = None) -> ASGIApp:
    """Handle one completions or chat completions request; returns the ASGI response to send. `caller`:
    the door already passed (the Responses API's route reads its own body after it, then comes here)."""
    state: GatewayState = request.app.state.gateway
    tracing = getattr(state, "tracing", None)
    if tracing is None:  # off: nothing below traces
        return await _pipeline(request, state, chat, None, caller)
    trace = tracing.begin(request)  # ended by the run's end, or here when the request is refused
    try:
        return await _pipeline(request, state, chat, trace, caller)
    except APIError as exc:
        trace.refused(exc)
        raise
    except BaseException as exc:
        trace.failed(exc)
        raise


async def _pipeline(
    request: Request, state: GatewayState, chat: bool, trace: RequestTrace | None, caller: Caller | None
) -> ASGIApp:
    headers = request_headers(request.scope)  # read at the edge already, unless its check did not run
    if caller is None:
        caller = await door(request, state, headers)
    ctx = await parse(request, state, caller, chat, headers)
    if trace is not None:
        trace.identify(ctx)
    if ctx.idempotency_key is None:  # the common request: no key, so nothing to claim, replay or let go
        ctx, admission = await admit(state, ctx, trace)
        return respond(ctx, admission, submit(state, ctx, admission, None, trace))
    async with KeyClaim(state, ctx) as claim:
        if claim.earlier_answer is not None:
            if trace is not None:
                trace.replayed()
            return claim.earlier_answer
        ctx, admission = await admit(state, ctx, trace)
        run = submit(state, ctx, admission, claim, trace)
    return respond(ctx, admission, run)


async def door(request: Request, state: GatewayState, headers: RequestHeaders) -> Caller:
    """Who calls, refused before the body is read when the server drains or is overloaded."""
    if state.draining:
        retry = str(state.admission.retry_after(1.0))
        message = "the server is shutting down; retry on another replica"
        raise refused(state, None, APIError(503, message, "shutting_down", headers={"Retry-After": retry}))
    caller = await authenticate_bearer(
        request, headers.bearer, state.keys, state.auth_budget, state.metrics.auth_failures
    )
    tenant = caller.tenant
    request.scope["state"][TENANT_KEY] = tenant.name  # for the access log (gateway/ops/logs.py): never a key
    shed = await state.edge.shed(state.engine.stats(), tenant.id, quota_limits(caller), tenant.weight)
    if shed is not None:  # before the body is read: an overloaded server spends nothing more on it
        raise rejected(state, tenant.id, shed)
    return caller


async def admit(
    state: GatewayState, ctx: RequestContext, trace: RequestTrace | None = None
) -> tuple[RequestContext, Admission]:
    """The request as it will be served and its place: 409 for a request id in use, then the deadline on
    the requested model's estimate (an infeasible one rejected or degraded per X-On-Infeasible:
    gateway/openai/degrade.py), queue bounds and quota in one call (admission/edge.py); a refusal raises
    the counted APIError with its retry headers."""
    _check_request_id(state, ctx)
    if ctx.id_chosen and await _id_already_used(state, ctx.tenant_id, ctx.request_id):
        # The ledger keeps one row per request id; a second request under the same id would lose its row.
        message = f"request id {ctx.request_id!r} was already used; send a new X-Request-Id"
        raise APIError(409, message, "duplicate_request_id", "X-Request-Id")
    admitting_at = time.time_ns()
    ctx, verdict = await degrade.admit(state, ctx)
    if trace is not None:
        trace.admission(admitting_at, verdict)
    if isinstance(verdict, Rejection):
        record_infeasible(state, ctx, verdict)
        raise rejected(state, ctx.tenant_id, verdict)
    return ctx, verdict


def respond(ctx: RequestContext, admission: Admission, run: Run) -> RunResponse:
    """The response that sends the run's reply, with the admission's headers."""
    headers = {
        "X-Request-Id": ctx.request_id,
        "X-Estimated-Start-Ms": str(admission.estimated_start_ms),
        **degrade.headers(ctx),
    }
    if admission.quota is not None:
        headers.update(quota_headers(admission.quota))
        if admission.quota_unenforced:  # failed open: say so
            headers[QUOTA_STATUS_HEADER] = "unenforced; reason=backend_unavailable"
    return RunResponse(run, headers)


GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions", "/v1/responses")


def _spent(state: GatewayState, tenant_id: str) -> APIError | None:
    """429 `too_many_refusals` (counted) while the tenant's refusal budget is spent."""
    wait = state.refusals.retry_after(tenant_id)
    if wait is None:
        return None
    message = "too many refused requests from this tenant; fix the requests before retrying"
    err = APIError(429, message, "too_many_refusals", headers={"Retry-After": str(wait)})
    return refused(state, tenant_id, err)


def refuse_spent_tenant(scope: Scope) -> APIError | None:
    """EdgeMiddleware's check before a body is read: a generation request whose key is in the cache and
    whose tenant has spent its refusal budget is refused without reading (or parsing) the body."""
    state: GatewayState | None = getattr(scope["app"].state, "gateway", None)
    if state is None or scope.get("path") not in GENERATION_PATHS:
        return None
    token = request_headers(scope).bearer  # kept in the scope: the pipeline reads them from there
    if token is None:
        return None
    generation = state.keys.generation
    found = state.keys.peek(token)[1]
    if found is None:
        return None
    # `authenticate_bearer` takes the cached key from here, unless an invalidation came in between.
    scope[PEEKED_KEY] = (token, found, generation)
    return _spent(state, found[0].id)


async def parse(
    request: Request, state: GatewayState, caller: Caller, chat: bool, headers: RequestHeaders
) -> RequestContext:
    """`read_request`, refused with 429 at once while the tenant's refusal budget is spent, and charging
    the budget for every request it refuses (a 400): refused work costs its sender."""
    spent = _spent(state, caller.tenant.id)
    if spent is not None:
        raise spent
    tenant_id = caller.tenant.id
    try:
        return await read_request(request, state, caller, chat, headers)
    except APIError as err:
        if err.status == 400:
            state.refusals.charge(tenant_id)
        raise


def _check_request_id(state: GatewayState, ctx: RequestContext) -> None:
    """409 for a request id of this tenant that is in flight."""
    if (ctx.tenant_id, ctx.request_id) in state.runs.by_id:
        raise APIError(
            409, f"request id {ctx.request_id!r} is already in flight", "duplicate_request_id", "X-Request-Id"
        )


async def _id_already_used(state: GatewayState, tenant_id: str, request_id: str) -> bool:
    """A client-chosen request id this tenant already used (recent in this process, or in SQL).

    Scoped to the tenant: another tenant's use of the same string neither blocks nor shows here.
    """
    if (tenant_id, request_id) in state.finished_ids:
        return True
    try:
        return await asyncio.to_thread(state.store.usage_exists, tenant_id, request_id)
    except Exception:  # a database outage must not turn every request with an X-Request-Id away
        log.warning("could not check request id %s against the ledger", request_id, exc_info=True)
        return False
