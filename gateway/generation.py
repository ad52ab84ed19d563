"""The generation pipeline: auth, validation, idempotency, admission, quota, then one engine Run."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from datetime import UTC, datetime

from starlette.requests import Request
from starlette.types import ASGIApp

from admission.backoff import ratelimit_headers
from admission.breaker import BackendUnavailable
from admission.controller import Rejection
from admission.queues import QueueSlot
from admission.quota import QuotaDecision, QuotaLimits
from billing import UsageRecord
from engine import OutputStream, RequestMeta
from gateway import request_parsing as rp
from gateway.auth import Caller, authenticate
from gateway.errors import APIError
from gateway.idempotency import Claim, fingerprint
from gateway.middleware import new_request_id
from gateway.openai_format import Shape
from gateway.responses import FollowResponse, RunResponse, StoredResponseSender
from gateway.runs import Outcome, Run, RunFeed, RunSpec, publish_chunks
from gateway.state import GatewayState

log = logging.getLogger(__name__)
FINISHED_IDS_KEPT = 100_000  # far more than one ledger flush interval's worth of requests
QUOTA_STATUS_HEADER = "X-Quota-Status"  # on requests admitted while quotas could not be enforced


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


def _quota_headers(decision: QuotaDecision | None) -> dict[str, str]:
    if decision is None or decision.limit is None or not decision.policy:
        return {}
    return ratelimit_headers(decision.policy, decision.limit, decision.remaining or 0, decision.reset_s)


async def _peek_quota(state: GatewayState, caller: Caller, limits: QuotaLimits) -> QuotaDecision | None:
    """The tenant's quota state without consuming any (a zero-token reservation holds nothing to settle)."""
    if not limits.windows():
        return None
    return await state.quota.reserve(caller.tenant.id, 0, limits)


def _quota_unavailable(state: GatewayState, tenant_id: str, decision: QuotaDecision) -> APIError:
    """Quotas fail closed and Redis is away: 503 with the breaker's time to its next probe."""
    retry = str(state.admission.retry_after(decision.retry_after_s))
    return _refused(state, tenant_id, APIError(503, "the quota backend is unavailable; retry later",
                                               "quota_unavailable", headers={"Retry-After": retry}))


def _refused(state: GatewayState, tenant_id: str | None, err: APIError) -> APIError:
    """Count and log an edge refusal (metrics and the dashboard's recent list); returns `err`."""
    state.metrics.rejections.labels(err.code or "other").inc()
    state.rejections.record(err.code or "other", err.status, err.headers.get("Retry-After"), tenant_id, err.message)
    return err


async def _reject(state: GatewayState, caller: Caller, limits: QuotaLimits, r: Rejection) -> APIError:
    headers = _quota_headers(await _peek_quota(state, caller, limits))
    if r.retry_after_s is not None:
        headers["Retry-After"] = str(r.retry_after_s)
    if r.estimated_start_ms is not None:
        headers["X-Estimated-Start-Ms"] = str(r.estimated_start_ms)
    return _refused(state, caller.tenant.id, APIError(r.status, r.message, r.code, headers=headers))


async def _claim(state: GatewayState, tenant_id: str, key: str, fp: str, request_id: str) -> Claim:
    """Claim the Idempotency-Key; 503 `idempotency_unavailable` when its store (Redis) is away.

    Only keyed requests need the store, so only they are refused: the rest is served as usual.
    """
    try:
        return await state.idempotency.claim(tenant_id, key, fp, request_id)
    except BackendUnavailable as exc:
        retry = str(state.admission.retry_after(exc.retry_after_s))
        raise _refused(state, tenant_id, APIError(
            503, "idempotency records are unavailable; retry later, or send the request without Idempotency-Key",
            "idempotency_unavailable", "Idempotency-Key", headers={"Retry-After": retry})) from None


async def generation(request: Request, chat: bool) -> ASGIApp:
    """Handle one completions or chat completions request; returns the ASGI response to send."""
    state: GatewayState = request.app.state.gateway
    if state.draining:
        raise _refused(state, None, APIError(503, "the server is shutting down; retry on another replica",
                                             "shutting_down",
                                             headers={"Retry-After": str(state.admission.retry_after(1.0))}))
    caller = await authenticate(request, state.keys, state.auth_budget, state.metrics.auth_failures)
    shed = state.admission.shed(state.engine.stats())
    if shed is not None:
        raise await _reject(state, caller, QuotaLimits(caller.tenant.tokens_per_minute, caller.tenant.tokens_per_day),
                           shed)
    now = time.time()
    ident = rp.identity(request)
    deadline = rp.deadline(request, now)
    raw = await request.body()
    body = rp.parse_body(raw, chat)
    if deadline is not None and deadline <= now:
        raise _refused(state, caller.tenant.id, APIError(408, f"deadline passed {(now - deadline) * 1000:.0f} ms ago",
                                                         "deadline_passed", "X-Deadline"))
    if not state.engine.is_alive or state.engine_failed:
        raise APIError(503, "the engine is not running", "engine_unavailable", headers={"Retry-After": "1"})
    inputs = await rp.engine_input_async(body, state.engine)
    headers = {"X-Request-Id": ident.request_id}
    key = ident.idempotency_key
    tenant_id = caller.tenant.id
    if key is not None:
        claim = await _claim(state, tenant_id, key, fingerprint(request.url.path, json.loads(raw)), ident.request_id)
        if claim.outcome == "mismatch":
            raise APIError(422, "Idempotency-Key was already used with a different request body",
                           "idempotency_key_reused", "Idempotency-Key")
        if claim.outcome == "replay":
            assert claim.response is not None
            return StoredResponseSender(claim.response, {"Idempotent-Replayed": "true",
                                                          "X-Request-Id": claim.request_id or ident.request_id})
        if claim.outcome == "attach":
            attached = {"Idempotent-Replayed": "true", "X-Request-Id": claim.request_id or ident.request_id}
            local = state.runs.by_key.get((tenant_id, key))
            if local is not None:
                return RunResponse(local, attached)
            return FollowResponse(state.idempotency.follow(tenant_id, key), bool(body.stream), attached)
    if (tenant_id, ident.request_id) in state.runs.by_id:
        if key is not None:
            await state.idempotency.abandon(tenant_id, key)
        raise APIError(409, f"request id {ident.request_id!r} is already in flight", "duplicate_request_id",
                       "X-Request-Id")
    if request.headers.get("x-request-id") == ident.request_id and await _id_already_used(state, tenant_id, ident.request_id):
        # The ledger keeps one row per request id; a second request under the same id would lose its row.
        if key is not None:
            await state.idempotency.abandon(tenant_id, key)
        raise APIError(409, f"request id {ident.request_id!r} was already used; send a new X-Request-Id",
                       "duplicate_request_id", "X-Request-Id")
    try:
        return await _admit_and_start(state, caller, ident, deadline, now, body, inputs, chat, headers)
    except APIError:
        if key is not None:
            await state.idempotency.abandon(tenant_id, key)
        raise


async def _admit_and_start(state: GatewayState, caller: Caller, ident: rp.Identity, deadline: float | None,
                           now: float, body: rp.CompletionRequest | rp.ChatCompletionRequest, inputs: rp.EngineInput,
                           chat: bool, headers: dict[str, str]) -> ASGIApp:
    tenant = caller.tenant
    limits = QuotaLimits(tenant.tokens_per_minute, tenant.tokens_per_day)
    n_prompt = len(inputs.prompt_token_ids)
    verdict = state.admission.admit(tenant.id, n_prompt, inputs.params.max_tokens, deadline, now,
                                    state.engine.stats(), tenant.max_queued_requests)
    if isinstance(verdict, Rejection):
        raise await _reject(state, caller, limits, verdict)
    slot = verdict.slot
    quota: QuotaDecision | None = None
    if limits.windows():
        try:  # Redis is awaited here: a request cancelled meanwhile must not keep its queue slot
            quota = await state.quota.reserve(tenant.id, n_prompt + inputs.params.max_tokens, limits)
        except BaseException:
            slot.release()
            raise
        if not quota.allowed and quota.reason == "backend_unavailable":
            slot.release()
            raise _quota_unavailable(state, tenant.id, quota)
        if not quota.allowed:
            slot.release()
            retry = str(state.admission.retry_after(quota.retry_after_s))
            raise _refused(state, tenant.id, APIError(
                429, f"tenant token quota exceeded ({quota.reason or 'insufficient tokens'})", "quota_exceeded",
                headers={**_quota_headers(quota), "Retry-After": retry}))
    meta = RequestMeta(tenant_id=tenant.id, api_key_id=caller.key.id, user=body.user, task_id=ident.task_id,
                       workflow_run_id=ident.workflow_run_id, attempt=ident.attempt, priority=tenant.priority_class,
                       weight=tenant.weight, deadline=deadline, arrival_time=now, cache_group=tenant.cache_group,
                       cache_salt=body.cache_salt)
    spec = RunSpec(ident.request_id, tenant.id, ident.task_id, Shape(chat, ident.request_id, body.model, int(now)),
                   bool(body.stream), body.include_usage, ident.idempotency_key, engine_id=new_request_id(),
                   continuous_usage=body.continuous_usage)
    engine = state.engine
    run = Run(spec, abort=lambda reason: engine.abort(spec.engine_id, reason),
              orphan_grace_s=state.settings.idempotent_orphan_grace_s)
    run.submitted_at = time.perf_counter()
    feed = RunFeed(run, slot.start, lambda outcome: _record(state, run, outcome, meta, caller))
    stream: OutputStream | None = None
    try:  # submitted here, not when the task below first runs: the engine sees it one loop pass sooner
        stream = engine.submit(inputs.prompt_token_ids, inputs.params, meta, spec.engine_id, sink=feed)
    except Exception as exc:  # a race the edge checks missed, or a dead engine: the feed reports it as usual
        feed(exc)
    state.runs.add(run)
    run.task = asyncio.create_task(_own(state, run, feed, stream, slot, quota, limits, meta, caller))
    headers = {**headers, **_quota_headers(quota), "X-Estimated-Start-Ms": str(verdict.estimated_start_ms)}
    if quota is not None and quota.reason == "backend_unavailable":
        headers[QUOTA_STATUS_HEADER] = "unenforced; reason=backend_unavailable"  # failed open: say so
    return RunResponse(run, headers)


async def _own(state: GatewayState, run: Run, feed: RunFeed, stream: OutputStream | None, slot: QueueSlot,
               quota: QuotaDecision | None, limits: QuotaLimits, meta: RequestMeta, caller: Caller) -> None:
    """Wait for the run to end, then settle quota, write the ledger row and the idempotency record."""
    spec = run.spec
    key = spec.idempotency_key
    publisher = None
    if key is not None and spec.stream:
        async def publish(chunk: str) -> None:
            await state.idempotency.append(spec.tenant_id, key, chunk)
        publisher = asyncio.create_task(publish_chunks(run, publish))
    try:
        outcome = await feed.outcome
    finally:
        if stream is not None:
            stream.close()  # ended already, unless this task was cancelled: then it aborts the request
        slot.release()
        state.runs.remove(run)
    await asyncio.sleep(0)  # the readers woke at the last notify: let them send the reply before the bookkeeping
    if run.error is not None and run.error.code == "engine_unavailable" and not state.engine.is_alive:
        state.engine_failed = True  # unless a new worker is already up (gateway/engine_watch.py)
    m = outcome.metrics
    if quota is not None and quota.reservation_id is not None:
        used = (m.prompt_tokens + m.completion_tokens) if m is not None else 0
        try:
            await state.quota.settle(spec.tenant_id, quota.reservation_id, used, limits)
        except Exception:
            log.warning("quota settle failed for %s", spec.request_id, exc_info=True)
    _observe(state, outcome, meta, caller)
    if key is not None:
        if publisher is not None:
            try:
                await publisher
            except Exception:
                log.warning("publishing stream events of %s failed", spec.request_id, exc_info=True)
        if run.final is not None and outcome.cancelled_by != "disconnect":
            await state.idempotency.finish(spec.tenant_id, key, run.final)
        else:
            await state.idempotency.abandon(spec.tenant_id, key)


def _ms(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else max(end - start, 0.0) * 1000.0


def _observe(state: GatewayState, outcome: Outcome, meta: RequestMeta, caller: Caller) -> None:
    """Metrics of one ended run (after the reply: nothing here is needed before the last byte)."""
    if outcome.status == "rejected" and outcome.metrics is None:
        return
    state.metrics.labels.learn(caller.tenant.id, caller.tenant.name)
    if outcome.metrics is not None:
        state.metrics.observe_finished(meta.tenant_id, outcome.status, outcome.metrics)
    else:
        state.metrics.requests.labels(state.metrics.labels.label(meta.tenant_id), outcome.status).inc()


def _record(state: GatewayState, run: Run, outcome: Outcome, meta: RequestMeta, caller: Caller) -> None:
    """The run's ledger row, called by its RunFeed as it ends and before any reader is woken to send the
    reply's end: `Ledger.record` journals the row (one write()) first, so an answered request survives a
    kill -9 of this process (docs/billing.md, "Journal")."""
    m = outcome.metrics
    if outcome.status == "rejected" and m is None:
        return  # refused by the engine before any work: nothing to bill, and the reply is an error
    finished = time.time()
    status = outcome.status
    row = UsageRecord(
        request_id=run.spec.request_id, tenant_id=meta.tenant_id, api_key_id=caller.key.id, task_id=meta.task_id,
        workflow_run_id=meta.workflow_run_id, attempt=meta.attempt, model=run.spec.shape.model, status=status,
        finish_reason=outcome.finish_reason.value if outcome.finish_reason else None,
        cancel_state=m.cancel_state if m else None, prompt_tokens=m.prompt_tokens if m else 0,
        cached_tokens=m.cached_tokens if m else 0, completion_tokens=m.completion_tokens if m else 0,
        charged_service=m.charged_service if m else 0.0, tokens_after_cancel=m.tokens_after_cancel if m else 0,
        preemptions=m.preemptions if m else 0, recomputed_tokens=m.recomputed_tokens if m else 0,
        queue_ms=_ms(m.arrival_time, m.first_scheduled_time) if m else None,
        ttft_ms=_ms(m.arrival_time, m.first_token_time) if m else None,
        e2e_ms=_ms(m.arrival_time, m.finished_time or finished) if m else None,
        created_at=datetime.fromtimestamp(meta.arrival_time, UTC), finished_at=datetime.fromtimestamp(finished, UTC),
    )
    try:
        state.ledger.record(row)
    except Exception:  # the ledger spills on its own; a full buffer must not fail the response
        log.warning("ledger refused row %s", row.request_id, exc_info=True)
    state.finished_ids[(row.tenant_id, row.request_id)] = None
    if len(state.finished_ids) > FINISHED_IDS_KEPT:
        state.finished_ids.popitem(last=False)
