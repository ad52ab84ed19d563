"""OpenTelemetry traces of the engine's side of a request: queue wait, prefill (its chunks as events), decode
and cancellation, as children of the gateway's span.

The gateway puts its request span's W3C `traceparent` in the request's `RequestMeta` (so it crosses the
ZeroMQ boundary inside `Submit`, to the local worker and to a remote `fairserve engine` alike). The engine
builds its spans when the request ends, from the timestamps it records anyway (arrival, first scheduled,
first token, cancel signal, finished) plus the times of its prefill chunks, and exports them from its own
process over OTLP/HTTP with the same settings as the gateway (`--otlp-endpoint`, or the standard
`OTEL_EXPORTER_OTLP_*` variables). Spans are made after the fact rather than kept open across iterations,
so the loop does no tracing work at all for a request without a `traceparent`, and nothing is imported or
started when no endpoint is configured (`make_provider` returns None).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import Sampler

    from engine.core.request import Request
    from engine.core.scheduler_output import SchedulerOutput

ENGINE_SERVICE = "fairserve-engine"
TRACES_PATH = "/v1/traces"


def traces_endpoint(configured: str | None, env: Mapping[str, str] = os.environ) -> str | None:
    """Where spans go: `configured` (a base URL gets /v1/traces), else OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (as
    is), else OTEL_EXPORTER_OTLP_ENDPOINT + /v1/traces (the OTLP exporter specification); None: tracing off.
    OTEL_SDK_DISABLED=true turns it off whatever is set."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if configured:
        return (
            configured
            if configured.rstrip("/").endswith(TRACES_PATH)
            else configured.rstrip("/") + TRACES_PATH
        )
    if env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
    if env.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return env["OTEL_EXPORTER_OTLP_ENDPOINT"].rstrip("/") + TRACES_PATH
    return None


def make_provider(endpoint: str, default_service: str, sampler: Sampler) -> TracerProvider:
    """A tracer provider exporting OTLP/HTTP protobuf to `endpoint` in batches (a background thread), named
    OTEL_SERVICE_NAME or `default_service`; OTEL_RESOURCE_ATTRIBUTES and OTEL_BSP_* are honoured by the SDK."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    service = os.environ.get("OTEL_SERVICE_NAME") or default_service
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service}), sampler=sampler)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    return provider


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


class EngineTracer:
    """Spans of traced requests (those whose meta carries a `traceparent`), made as each one ends."""

    def __init__(self, endpoint: str) -> None:
        from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        # The gateway decided: a sampled parent is recorded, anything else is not.
        self.provider = make_provider(endpoint, ENGINE_SERVICE, ParentBased(ALWAYS_OFF))
        self.tracer = self.provider.get_tracer("fairserve.engine")
        self._propagator = TraceContextTextMapPropagator()
        self._chunks: dict[str, list[tuple[float, float, int, int]]] = {}  # id -> (start, end, first, tokens)

    def note_chunks(self, out: SchedulerOutput, t0: float, t1: float) -> None:
        """The prefill chunks of traced requests that ran from `t0` to `t1` (epoch seconds)."""
        for c in out.chunks:
            request = c.request
            if request.meta.traceparent is not None and c.start < request.num_prompt_tokens:
                self._chunks.setdefault(request.request_id, []).append((t0, t1, c.start, c.length))

    def finished(self, request: Request) -> None:
        """Export the request's engine spans (a no-op for an untraced one)."""
        chunks = self._chunks.pop(request.request_id, [])
        if request.meta.traceparent is None:
            return
        parent = self._propagator.extract({"traceparent": request.meta.traceparent})
        end = request.finished_time or request.meta.arrival_time
        scheduled = request.first_scheduled_time
        first_token = request.first_token_time
        common = {"fairserve.request_id": request.request_id, "fairserve.tenant_id": request.meta.tenant_id}
        self._span("engine.queue", request.meta.arrival_time, scheduled or end, parent, common)
        if scheduled is not None:
            prefill = self.tracer.start_span(
                "engine.prefill",
                context=parent,
                start_time=_ns(scheduled),
                attributes={
                    **common,
                    "fairserve.prompt_tokens": request.num_prompt_tokens,
                    "fairserve.cached_tokens": request.num_cached_tokens,
                    "fairserve.preemptions": len(request.preemptions),
                    "fairserve.recomputed_tokens": request.recomputed_tokens,
                },
            )
            for start, stop, first, tokens in chunks:
                prefill.add_event(
                    "prefill.chunk",
                    {
                        "fairserve.chunk.first_token": first,
                        "fairserve.chunk.tokens": tokens,
                        "fairserve.chunk.seconds": stop - start,
                    },
                    timestamp=_ns(start),
                )
            prefill.end(_ns(first_token or end))
        if first_token is not None:
            self._span(
                "engine.decode",
                first_token,
                end,
                parent,
                {
                    **common,
                    "fairserve.completion_tokens": len(request.output_token_ids),
                    "fairserve.finish_reason": str(
                        request.finish_reason.value if request.finish_reason else ""
                    ),
                },
            )
        if request.cancel_time is not None:
            self._span(
                "engine.cancel",
                request.cancel_time,
                max(end, request.cancel_time),
                parent,
                {
                    **common,
                    "fairserve.cancel_state": request.cancel_state or "",
                    "fairserve.tokens_after_cancel": request.tokens_after_cancel,
                },
            )

    def _span(self, name: str, start: float, end: float, parent: Any, attributes: dict[str, Any]) -> None:
        span = self.tracer.start_span(name, context=parent, start_time=_ns(start), attributes=attributes)
        span.end(_ns(max(start, end)))

    def shutdown(self) -> None:
        """Export what is batched and stop the exporter's thread (bounded by the SDK's own timeouts)."""
        self.provider.shutdown()


def make_engine_tracer(otlp_endpoint: str | None) -> EngineTracer | None:
    """The engine's tracer, or None when no endpoint is configured (then nothing is imported)."""
    endpoint = traces_endpoint(otlp_endpoint)
    return EngineTracer(endpoint) if endpoint else None
