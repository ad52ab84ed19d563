"""The generation pipeline, in one pass: authenticate, read the RequestContext, claim the Idempotency-Key,
admit (deadline, queue bounds and quota in one call), run one engine request, write the ledger row."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.types import ASGIApp, Scope

from admission.controller import Rejection
from admission.edge import Admission
from engine import OutputStream
from gateway.edge.auth import Caller, authenticate
from gateway.edge.errors import APIError
from gateway.idempotency.claim import KeyClaim
from gateway.openai import degrade
from gateway.openai.context import RequestContext, quota_limits, read_request
from gateway.openai.refusals import quota_headers, refused, rejected
from gateway.openai.responses import RunResponse
from gateway.openai.runs import Outcome, Run, RunFeed
from gateway.openai.tasks import record_infeasible
from gateway.ops.produced import confirm
from gateway.state import GatewayState

if TYPE_CHECKING:
    from gateway.ops.tracing import RequestTrace

log = logging.getLogger(__name__)
FINISHED_IDS_KEPT = 100_000  # far more than one ledger flush interval's worth of requests
QUOTA_STATUS_HEADER = "X-Quota-Status"  # on requests admitted while quotas could not be enforced


async def generation(request: Request, chat: bool) -> ASGIApp:
    """Handle one completions or chat completions request; returns the ASGI response to send."""
    tracing = getattr(request.app.state.gateway, "tracing", None)
    if tracing is None:  # off: nothing below traces
        return await _generation(request, chat, None)
    trace = tracing.begin(request)  # ended by the run's owner, or here when the request is refused
    try:
        return await _generation(request, chat, trace)
    except APIError as exc:
        trace.refused(exc)
        raise
    except BaseException as exc:
        trace.failed(exc)
        raise


async def _generation(request: Request, chat: bool, trace: RequestTrace | None) -> ASGIApp:
    state: GatewayState = request.app.state.gateway
    if state.draining:
        raise refused(
            state,
            None,
            APIError(
                503,
                "the server is shutting down; retry on another replica",
                "shutting_down",
                headers={"Retry-After": str(state.admission.retry_after(1.0))},
            ),
        )
    caller = await authenticate(request, state.keys, state.auth_budget, state.metrics.auth_failures)
    shed = await state.edge.shed(
        state.engine.stats(), caller.tenant.id, quota_limits(caller), caller.tenant.weight
    )
    if shed is not None:  # before the body is read: an overloaded server spends nothing more on it
        raise rejected(state, caller.tenant.id, shed)
    ctx = await _read_charged(request, state, caller, chat)
    if trace is not None:
        trace.identify(ctx)
    async with KeyClaim(state, ctx) as claim:
        if claim.earlier_answer is not None:
            if trace is not None:
                trace.replayed()
            return claim.earlier_answer
        await _check_request_id(state, ctx)
        admitting_at = time.time_ns()
        ctx, verdict = await degrade.admit(
            state, ctx
        )  # per model; perhaps degraded (gateway/openai/degrade.py)
        if trace is not None:
            trace.admission(admitting_at, verdict)
        if isinstance(verdict, Rejection):
            record_infeasible(state, ctx, verdict)
            raise rejected(state, ctx.tenant_id, verdict)
        run = _start(state, ctx, verdict, claim, trace)
    headers = {
        "X-Request-Id": ctx.request_id,
        **quota_headers(verdict.quota),
        "X-Estimated-Start-Ms": str(verdict.estimated_start_ms),
        **degrade.headers(ctx),
    }
    if verdict.quota_unenforced:
        headers[QUOTA_STATUS_HEADER] = "unenforced; reason=backend_unavailable"  # failed open: say so
    return RunResponse(run, headers)


GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions")


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
    header = next((v for k, v in scope["headers"] if k == b"authorization"), b"").decode("latin-1")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    found = state.keys.peek(token.strip())[1]
    return None if found is None else _spent(state, found[0].id)


async def _read_charged(request: Request, state: GatewayState, caller: Caller, chat: bool) -> RequestContext:
    """`read_request`, refused with 429 at once while the tenant's refusal budget is spent, and charging
    the budget for every request it refuses (a 400): refused work costs its sender."""
    spent = _spent(state, caller.tenant.id)
    if spent is not None:
        raise spent
    tenant_id = caller.tenant.id
    try:
        return await read_request(request, state, caller, chat)
    except APIError as err:
        if err.status == 400:
            state.refusals.charge(tenant_id)
        raise


async def _check_request_id(state: GatewayState, ctx: RequestContext) -> None:
    """409 for a request id of this tenant that is in flight, or (the client's own) already in the ledger."""
    if (ctx.tenant_id, ctx.request_id) in state.runs.by_id:
        raise APIError(
            409, f"request id {ctx.request_id!r} is already in flight", "duplicate_request_id", "X-Request-Id"
        )
    if ctx.id_chosen and await _id_already_used(state, ctx.tenant_id, ctx.request_id):
        # The ledger keeps one row per request id; a second request under the same id would lose its row.
        raise APIError(
            409,
            f"request id {ctx.request_id!r} was already used; send a new X-Request-Id",
            "duplicate_request_id",
            "X-Request-Id",
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


def _start(
    state: GatewayState,
    ctx: RequestContext,
    admission: Admission,
    claim: KeyClaim,
    trace: RequestTrace | None,
) -> Run:
    """Submit the engine request and start the task that owns the run to its end."""
    spec = ctx.run_spec()
    engine = degrade.engine_of(state, ctx)
    run = Run(
        spec,
        abort=lambda reason: engine.abort(spec.engine_id, reason),
        orphan_grace_s=state.settings.idempotent_orphan_grace_s,
    )
    run.submitted_at = time.perf_counter()
    feed = RunFeed(run, admission.slot.start, lambda outcome: _record(state, ctx, outcome, run))
    admission.slot.on_push_out = lambda slot: run.push_out(
        rejected(state, ctx.tenant_id, state.admission.pushed_out(slot, state.engine.stats()))
    )
    stream: OutputStream | None = None
    meta = ctx.meta()
    meta.public_prefix_tokens = state.prefixes.match(ctx.body.model, ctx.inputs.prompt_token_ids)
    if trace is not None:  # the engine's spans descend from this one (engine/tracing.py)
        meta.traceparent = trace.traceparent()
    try:  # submitted here, not when the task below first runs: the engine sees it one loop pass sooner
        stream = engine.submit(
            ctx.inputs.prompt_token_ids, ctx.inputs.params, meta, spec.engine_id, sink=feed
        )
    except Exception as exc:  # a race the edge checks missed, or a dead engine: the feed reports it as usual
        feed(exc)
    state.runs.add(run)
    claim.hand_over(run)
    run.task = asyncio.create_task(_own(state, ctx, run, feed, stream, admission, claim, trace))
    return run


async def _own(
    state: GatewayState,
    ctx: RequestContext,
    run: Run,
    feed: RunFeed,
    stream: OutputStream | None,
    admission: Admission,
    claim: KeyClaim,
    trace: RequestTrace | None = None,
) -> None:
    """Wait for the run to end, then settle quota, count metrics and settle the idempotency claim."""
    try:
        outcome = await feed.outcome
    finally:
        if stream is not None:
            stream.close()  # ended already, unless this task was cancelled: then it aborts the request
        admission.slot.release()
        state.runs.remove(run)
    await asyncio.sleep(
        0
    )  # the readers woke at the last notify: let them send the reply before the bookkeeping
    if (
        run.error is not None
        and run.error.code == "engine_unavailable"
        and not state.engine.is_alive
        and not state.settings.engines
    ):  # an attached engine rejoins by itself (engine/remote/client.py)
        state.engine_failed = True  # unless a new worker is already up (gateway/ops/engine_watch.py)
    m = outcome.metrics
    try:
        used = (m.prompt_tokens + m.completion_tokens) if m is not None else 0
        await state.edge.settle(ctx.tenant_id, admission, used, ctx.limits)
    except Exception:
        log.warning("quota settle failed for %s", ctx.request_id, exc_info=True)
    _observe(state, ctx, outcome)
    if trace is not None:
        trace.finish(outcome)
    await claim.settle(run, outcome)


def _observe(state: GatewayState, ctx: RequestContext, outcome: Outcome) -> None:
    """Metrics of one ended run (after the reply: nothing here is needed before the last byte)."""
    if outcome.status == "rejected" and outcome.metrics is None:
        return
    state.metrics.labels.learn(ctx.tenant_id, ctx.caller.tenant.name)
    if ctx.ident.task_id or ctx.ident.workflow_run_id:
        state.metrics.tasks.finished(
            ctx.tenant_id, ctx.ident.task_id, ctx.ident.attempt, outcome.status, outcome.metrics
        )
    if outcome.metrics is not None:
        state.metrics.observe_finished(ctx.tenant_id, outcome.status, outcome.metrics)
    else:
        state.metrics.requests.labels(state.metrics.labels.label(ctx.tenant_id), outcome.status).inc()


def _record(state: GatewayState, ctx: RequestContext, outcome: Outcome, run: Run) -> None:
    """The run's ledger row, called by its RunFeed as it ends and before any reader is woken to send the
    reply's end: `Ledger.record` journals the row (one write()) first, so an answered request survives a
    kill -9 of this process (docs/billing.md, "Journal")."""
    if outcome.status == "rejected" and outcome.metrics is None:
        return  # refused by the engine before any work: nothing to bill, and the reply is an error
    completion = outcome.metrics.completion_tokens if outcome.metrics is not None else 0
    row = ctx.usage_record(outcome, time.time(), run.delivered_tokens(completion))
    try:
        state.ledger.record(row)
    except Exception:  # the ledger spills on its own; a full buffer must not fail the response
        log.warning("ledger refused row %s", row.request_id, exc_info=True)
    else:
        if state.billed_ids is not None:  # attached engines forget their record (gateway/ops/produced.py)
            state.billed_ids.append((ctx.engine_id, row.completion_tokens))
            confirm(state)  # before the reply ends: an answered request is never billed `interrupted`
    state.finished_ids[(row.tenant_id, row.request_id)] = None
    if len(state.finished_ids) > FINISHED_IDS_KEPT:
        state.finished_ids.popitem(last=False)
