"""RequestContext: everything the edge decided about one generation request, read from HTTP once.

Authentication names the caller; this module reads the identity headers, the deadline and the body,
validates them and tokenises the prompt. Everything downstream (admission, the idempotency claim, the
engine request, the Run, the ledger row) is built from the context, so a new header is read in one
place (`parsing.identity`) and reaches the engine and the ledger through the methods below.
"""

from __future__ import annotations

import json
import operator
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request

from admission.edge import AdmissionAsk
from admission.quota import QuotaLimits
from billing import UsageRecord
from engine import RequestMeta, RequestMetrics
from gateway.edge.auth import Caller
from gateway.edge.errors import APIError
from gateway.edge.middleware import BODY_KEY, new_engine_id
from gateway.idempotency.records import fingerprint
from gateway.openai import parsing as rp
from gateway.openai.body_shape import SHAPE_SCAN_BYTES
from gateway.openai.format import Shape
from gateway.openai.logprobs import logprobs_view
from gateway.openai.preprocess import billable_cpu
from gateway.openai.runs import Outcome, RunSpec
from gateway.openai.schemas import ChatCompletionRequest, CompletionRequest
from gateway.openai.served import ServedAs, model_engine, requested_policy
from gateway.openai.tools import reply_stream
from gateway.state import GatewayState
from routing import served_models

# Ledger columns that are the engine's RequestMetrics fields of the same name, and their value when the
# request ended without metrics (refused by the engine, or a gateway bug).
_METRIC_COLUMNS: dict[str, Any] = {
    "cancel_state": None,
    "counted_by_gateway": False,
    "prompt_tokens": 0,
    "cached_tokens": 0,
    "completion_tokens": 0,
    "charged_service": 0.0,
    "tokens_after_cancel": 0,
    "preemptions": 0,
    "recomputed_tokens": 0,
}
_read_metrics = operator.attrgetter(*_METRIC_COLUMNS)  # one C call for all of them, not a getattr each


@dataclass(frozen=True)
class RequestContext:
    """What the edge decided: caller, ids (the client's and the gateway's engine id), deadline, body, inputs."""

    caller: Caller
    ident: rp.Identity
    # Read per request by nearly every stage: plain fields, set once by `read_request` from `caller` and
    # `ident` (a property would be a call each time).
    tenant_id: str  # the caller's tenant
    request_id: str  # the caller's request id (unique within its tenant only)
    idempotency_key: str | None  # the Idempotency-Key header, if any
    limits: QuotaLimits  # the tenant's token quotas
    id_chosen: bool  # X-Request-Id came from the client (then it must not repeat a ledger row's id)
    engine_id: str  # the gateway's own unique id for the engine request; no caller string names engine work
    chat: bool
    arrival: float  # time.time() when the request was read
    deadline: float | None
    body: CompletionRequest | ChatCompletionRequest
    fingerprint: str | None  # of the endpoint and body, only with an Idempotency-Key
    inputs: rp.EngineInput
    served: ServedAs  # the model that serves it and how (gateway/openai/degrade.py decides at admission)
    # The request's ASGI scope state (EdgeMiddleware's dict): the run's usage goes there for the access log.
    edge_state: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    # CPU seconds the gateway spent validating, rendering and tokenising it: charged as the tenant's service
    # by the engine (RequestMeta.preprocess_cpu_s; gateway/openai/preprocess.py).
    preprocess_cpu_s: float = 0.0

    def admission_ask(self) -> AdmissionAsk:
        """The one admission call's question: deadline, queue bounds and quota of this request."""
        return AdmissionAsk(
            self.tenant_id,
            len(self.inputs.prompt_token_ids),
            # n choices may each produce max_tokens: quotas and feasibility count them all.
            self.inputs.params.n * self.inputs.params.max_tokens,
            self.deadline,
            self.arrival,
            self.limits,
            self.caller.tenant.max_queued_requests,
            self.caller.tenant.weight,
        )

    def meta(self) -> RequestMeta:
        """Who asked and under what contract, for the engine's scheduler."""
        tenant = self.caller.tenant
        return RequestMeta(
            tenant_id=tenant.id,
            api_key_id=self.caller.key.id,
            user=self.body.user,
            task_id=self.ident.task_id,
            workflow_run_id=self.ident.workflow_run_id,
            attempt=self.ident.attempt,
            priority=tenant.priority_class,
            weight=tenant.weight,
            deadline=self.deadline,
            arrival_time=self.arrival,
            cache_group=tenant.cache_group,
            cache_salt=self.body.cache_salt,
            ledger_id=self.request_id,
            partial_at_deadline=self.served.partial_at_deadline,
            lora=self.served.lora,
            lora_path=self.served.lora_path,
            lora_registered=self.served.lora_registered,
            preprocess_cpu_s=billable_cpu(self.preprocess_cpu_s),
        )

    def run_spec(self) -> RunSpec:
        """The shape of the response the Run produces."""
        shape = Shape(
            self.chat, self.request_id, self.served.model, int(self.arrival), tools=reply_stream(self.body)
        )
        return RunSpec(
            self.request_id,
            self.tenant_id,
            self.ident.task_id,
            shape,
            bool(self.body.stream),
            self.body.include_usage,
            self.idempotency_key,
            engine_id=self.engine_id,
            continuous_usage=self.body.continuous_usage,
            logprobs=logprobs_view(self.chat, self.inputs.params.logprobs, self.served.engine.tokenizer),
            n=self.inputs.params.n,
        )

    def usage_record(self, outcome: Outcome, finished: float, delivered: int | None = None) -> UsageRecord:
        """The ledger row of the ended request: ids from the context, counts and timings from the engine."""
        m = outcome.metrics
        queue_ms, ttft_ms, e2e_ms = _timings(m, finished)
        counts = (
            dict(_METRIC_COLUMNS) if m is None else dict(zip(_METRIC_COLUMNS, _read_metrics(m), strict=True))
        )
        counts["charged_service"] *= self.served.cost_factor  # the serving model's `--model-cost`
        return UsageRecord(
            request_id=self.request_id,
            tenant_id=self.tenant_id,
            api_key_id=self.caller.key.id,
            task_id=self.ident.task_id,
            workflow_run_id=self.ident.workflow_run_id,
            attempt=self.ident.attempt,
            model=self.body.model,
            status=outcome.status,
            finish_reason=outcome.finish_reason.value if outcome.finish_reason else None,
            **counts,
            queue_ms=queue_ms,
            ttft_ms=ttft_ms,
            e2e_ms=e2e_ms,
            created_at=datetime.fromtimestamp(self.arrival, UTC),
            finished_at=datetime.fromtimestamp(finished, UTC),
            delivered_tokens=delivered,
            served_model=self.served.model,
            degradation=self.served.degradation,
            dropped_tokens=self.served.dropped,
        )


def quota_limits(caller: Caller) -> QuotaLimits:
    """The caller's tenant's token quotas."""
    return QuotaLimits(caller.tenant.tokens_per_minute, caller.tenant.tokens_per_day)


def _timings(m: RequestMetrics | None, finished: float) -> tuple[float | None, float | None, float | None]:
    """(queue, time to first token, end to end) in ms, from the engine's clock of the request (each at least
    0; written out rather than a helper per timing: the ledger row is made once per request)."""
    if m is None:
        return None, None, None
    start, scheduled, first = m.arrival_time, m.first_scheduled_time, m.first_token_time
    end = m.finished_time or finished
    return (
        None if scheduled is None else (scheduled - start if scheduled > start else 0.0) * 1000.0,
        None if first is None else (first - start if first > start else 0.0) * 1000.0,
        (end - start if end > start else 0.0) * 1000.0,
    )


async def read_request(
    request: Request, state: GatewayState, caller: Caller, chat: bool, headers: rp.RequestHeaders
) -> RequestContext:
    """Read and validate headers and body, then tokenise: 400 naming the field, 503 without an engine."""
    now = time.time()
    edge = request.scope["state"]  # EdgeMiddleware's: the request id, and whether the client chose it
    ident = rp.identity(headers, edge["request_id"], edge.get("request_id_refused"))
    deadline = rp.deadline(headers, now)
    raw = request.scope.get(BODY_KEY)  # left by EdgeMiddleware: no body stream to run through again
    if raw is None:
        raw = await request.body()
    tenant_id, weight = caller.tenant.id, caller.tenant.weight
    body, parse_cpu = await _parsed(state, raw, chat, tenant_id, weight, deadline)
    policy = requested_policy(headers.on_infeasible)  # 400 for a bad X-On-Infeasible
    # 404 for a model not served (or an adapter this tenant may not use). An adapter's request runs on
    # its base model's engines, with the adapter's name and path in its meta.
    engine, adapter = model_engine(state, body.model, tenant_id)
    if not state.engine_health.serves(engine):  # this model's engines; another model's may be down
        raise APIError(503, "the engine is not running", "engine_unavailable", headers={"Retry-After": "1"})
    as_base = body if adapter is None else body.model_copy(update={"model": engine.model_name})
    inputs, input_cpu = await rp.engine_input_async(
        as_base,
        engine,
        lambda work: state.preprocess.run(tenant_id, weight, work, deadline),
        lambda cpu: state.preprocess.charge(tenant_id, weight, cpu),
    )
    fp = fingerprint(request.url.path, json.loads(raw)) if ident.idempotency_key is not None else None
    return RequestContext(
        caller=caller,
        ident=ident,
        tenant_id=tenant_id,
        request_id=ident.request_id,
        idempotency_key=ident.idempotency_key,
        limits=quota_limits(caller),
        id_chosen=bool(edge["request_id_chosen"]),
        engine_id=new_engine_id(),
        chat=chat,
        arrival=now,
        deadline=deadline,
        body=body,
        fingerprint=fp,
        inputs=inputs,
        # The serving model's `--model-cost` is known now unless a fallback changes the model
        # (gateway/openai/degrade.py, which then charges the fallback's).
        served=ServedAs(
            body.model,
            engine,
            policy,
            cost_factor=state.settings.models.cost_factor(body.model),
            lora=None if adapter is None else adapter.name,
            lora_path=None if adapter is None else adapter.path,
            lora_registered=None
            if adapter is None or adapter.created_at is None
            else adapter.created_at.isoformat(),
        ),
        edge_state=edge,
        preprocess_cpu_s=parse_cpu + input_cpu,
    )


async def _parsed(
    state: GatewayState, raw: bytes, chat: bool, tenant_id: str, weight: float, deadline: float | None
) -> tuple[CompletionRequest | ChatCompletionRequest, float]:
    """The validated body and the CPU seconds validating it took: a small body on the loop (its CPU charged
    to the tenant's preprocessing order), a large one, counted first (gateway/openai/body_shape.py), through
    the preprocessing gate (gateway/openai/preprocess.py)."""
    settings = state.settings
    if len(raw) <= SHAPE_SCAN_BYTES:
        t0 = time.thread_time()
        try:
            body = rp.parse_body(raw, chat, settings.max_chat_messages, None, settings.max_json_depth)
        finally:
            cpu = time.thread_time() - t0
            state.preprocess.charge(tenant_id, weight, cpu)
        return body, cpu
    longest = max(c.max_model_len for c in served_models(state.engine))  # a prompt of ids over it: 400
    timed = await state.preprocess.run(
        tenant_id,
        weight,
        lambda: rp.parse_body(raw, chat, settings.max_chat_messages, longest, settings.max_json_depth),
        deadline,
    )
    return timed.value, timed.cpu_s
