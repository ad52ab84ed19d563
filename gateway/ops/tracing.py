"""OpenTelemetry traces of the gateway's side of a request: one server span per generation request, with the
admission decision as its child, exported over OTLP/HTTP protobuf.

The server span continues a caller's W3C `traceparent` (it becomes that span's child) or starts a trace,
sampled at `--trace-sample-ratio` (a caller's sampled flag is followed). A sampled span's own traceparent goes
to the engine in the request's metadata, so the engine's queue, prefill, decode and cancel spans
(engine/serving/tracing.py, exported by the engine's process) are its children, across the ZeroMQ boundary. Off (no
endpoint: `--otlp-endpoint`, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT) the
gateway holds None instead of a `GatewayTracing`: no import, no span, one `is None` per request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from admission.controller import Rejection
from engine.serving.tracing import make_provider, traces_endpoint

if TYPE_CHECKING:
    from opentelemetry.trace import Span
    from starlette.requests import Request

    from admission.edge import Admission
    from engine.config import EngineConfig
    from gateway.edge.errors import APIError
    from gateway.openai.context import RequestContext
    from gateway.openai.runs import Outcome

GATEWAY_SERVICE = "fairserve-gateway"


class GatewayTracing:
    """The gateway's tracer and the W3C propagator it reads callers' context with."""

    def __init__(self, endpoint: str, sample_ratio: float) -> None:
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = make_provider(endpoint, GATEWAY_SERVICE, ParentBased(TraceIdRatioBased(sample_ratio)))
        self.tracer = self.provider.get_tracer("fairserve.gateway")
        self.propagator = TraceContextTextMapPropagator()

    def begin(self, request: Request) -> RequestTrace:
        """The server span of one generation request, the child of the caller's span if it sent one."""
        from opentelemetry.trace import SpanKind

        path = request.url.path
        # No traceparent header (the common case without a traced caller): nothing to extract.
        caller = self.propagator.extract(request.headers) if "traceparent" in request.headers else None
        span = self.tracer.start_span(
            f"{request.method} {path}",
            context=caller,
            kind=SpanKind.SERVER,
            attributes={"http.request.method": request.method, "url.path": path},
        )
        return RequestTrace(self, span)

    def shutdown(self) -> None:
        """Export what is batched and stop the exporter's thread."""
        self.provider.shutdown()


class RequestTrace:
    """One request's server span, from `begin` until the run ends or the request is refused."""

    def __init__(self, tracing: GatewayTracing, span: Span) -> None:
        self.tracing = tracing
        self.span = span

    def traceparent(self) -> str | None:
        """The span's W3C traceparent for the engine, when it is sampled (else the engine traces nothing).

        Formatted here (version 00, the W3C Trace Context layout) rather than through the propagator's
        inject, which builds a context and a carrier per request for the same string."""
        ctx = self.span.get_span_context()
        if not ctx.trace_flags.sampled:
            return None
        return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"

    def admission(self, started_ns: int, verdict: Admission | Rejection) -> None:
        """The admission decision, a child span from `started_ns` to now."""
        from opentelemetry.trace import set_span_in_context

        if not self.span.is_recording():  # sampled out: its children would be dropped too
            return

        attributes: dict[str, Any]
        if isinstance(verdict, Rejection):
            attributes = {
                "fairserve.admission.decision": "rejected",
                "fairserve.admission.code": verdict.code,
            }
        else:
            attributes = {
                "fairserve.admission.decision": "admitted",
                "fairserve.admission.estimated_start_ms": verdict.estimated_start_ms,
            }
        child = self.tracing.tracer.start_span(
            "admission", context=set_span_in_context(self.span), start_time=started_ns, attributes=attributes
        )
        child.end()

    def identify(self, ctx: RequestContext) -> None:
        """Who asked for what, once the request is read."""
        self.span.set_attributes(
            {
                "fairserve.tenant_id": ctx.tenant_id,
                "fairserve.request_id": ctx.request_id,
                "fairserve.task_id": ctx.ident.task_id or "",
                "fairserve.workflow_run_id": ctx.ident.workflow_run_id or "",
                "gen_ai.request.model": ctx.body.model,
            }
        )

    def finish(self, outcome: Outcome) -> None:
        """End the span with how the run ended and the tokens it used (a cancellation as an event too)."""
        from opentelemetry.trace import Status, StatusCode

        m = outcome.metrics
        self.span.set_attributes(
            {
                "fairserve.status": outcome.status,
                "fairserve.finish_reason": str(outcome.finish_reason.value) if outcome.finish_reason else "",
                "gen_ai.usage.input_tokens": m.prompt_tokens if m is not None else 0,
                "gen_ai.usage.output_tokens": m.completion_tokens if m is not None else 0,
                "http.response.status_code": 200,
            }
        )
        if outcome.status == "cancelled":
            self.span.add_event("cancelled", {"fairserve.cancelled_by": outcome.cancelled_by or ""})
        if outcome.status == "error":
            self.span.set_status(Status(StatusCode.ERROR, "the run ended in error"))
        self.span.end()

    def replayed(self) -> None:
        """End the span of a request answered from an earlier run (an Idempotency-Key replay)."""
        self.span.set_attribute("fairserve.status", "replayed")
        self.span.end()

    def refused(self, error: APIError) -> None:
        """End the span of a request answered with an error before any run (4xx, 5xx)."""
        from opentelemetry.trace import Status, StatusCode

        code = error.code or "error"
        self.span.set_attributes({"http.response.status_code": error.status, "fairserve.status": code})
        if error.status >= 500:
            self.span.set_status(Status(StatusCode.ERROR, code))
        self.span.end()

    def failed(self, exc: BaseException) -> None:
        """End the span of a request that raised."""
        from opentelemetry.trace import Status, StatusCode

        self.span.record_exception(exc)
        self.span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
        self.span.end()


def make_gateway_tracing(config: EngineConfig) -> GatewayTracing | None:
    """The gateway's tracing, or None when no endpoint is configured (tracing off)."""
    endpoint = traces_endpoint(config.otlp_endpoint)
    return GatewayTracing(endpoint, config.trace_sample_ratio) if endpoint else None
