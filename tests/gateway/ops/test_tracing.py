"""OpenTelemetry traces, received by a real OTLP/HTTP collector that decodes the protobuf
(tests/gateway/otlp_receiver.py), from real `fairserve serve` and `fairserve engine` processes.

One request is one trace: the caller's span -> the gateway's server span (tenant, request, task, workflow,
model, status, tokens) -> admission, and the engine's queue, prefill (chunks as events), decode and cancel
spans, exported by the engine's own process (a remote `fairserve engine`, or `serve`'s worker)."""

from __future__ import annotations

import secrets
from pathlib import Path

import httpx
import pytest

from engine.serving.tracing import traces_endpoint
from tests.engine.serving.remote.engine_process import EngineProcess
from tests.gateway.otlp_receiver import ReceivedSpan, Receiver, otlp_receiver
from tests.gateway.serve_process import ServeProcess

SERVER_KIND = 2  # SPAN_KIND_SERVER in the OTLP protobuf
LONG_PROMPT = " ".join(f"word{i}" for i in range(120))  # several 32-token prefill chunks
OTEL_VARS = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_SERVICE_NAME",
    "OTEL_SDK_DISABLED",
)


@pytest.fixture(autouse=True)
def _quick_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing inherited; spans leave each process in batches every 100 ms instead of 5 s."""
    for name in OTEL_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")


def _caller() -> tuple[str, str]:
    return secrets.token_hex(16), secrets.token_hex(8)


def _server_span(rx: Receiver, request_id: str) -> ReceivedSpan:
    def found() -> ReceivedSpan | None:
        with rx.lock:
            return next(
                (
                    s
                    for s in rx.spans
                    if s.kind == SERVER_KIND and s.attributes.get("fairserve.request_id") == request_id
                ),
                None,
            )

    span: ReceivedSpan = rx.wait(found, what=f"the server span of {request_id}")
    return span


def _engine_spans(rx: Receiver, server: ReceivedSpan, names: tuple[str, ...]) -> dict[str, ReceivedSpan]:
    def found() -> dict[str, ReceivedSpan] | None:
        got = {n: rx.named(n, server.trace_id) for n in names}
        return {n: s[0] for n, s in got.items()} if all(got.values()) else None

    spans: dict[str, ReceivedSpan] = rx.wait(found, what=f"engine spans {names} of trace {server.trace_id}")
    return spans


def test_one_trace_from_the_caller_through_a_remote_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with otlp_receiver() as rx:
        engine = EngineProcess(
            tmp_path / "engine",
            "--num-kv-blocks",
            "512",
            "--max-num-batched-tokens",
            "32",
            "--otlp-endpoint",
            rx.endpoint,
        )
        serve: ServeProcess | None = None
        try:
            monkeypatch.setenv("OTEL_SERVICE_NAME", "gateway-under-test")  # the gateway's, not the engine's
            serve = ServeProcess(
                tmp_path / "gateway", "--engine", engine.address, "--otlp-endpoint", rx.endpoint
            )
            trace_id, parent_id = _caller()
            headers = {
                **serve.headers(serve.banner["api_key"]),
                "traceparent": f"00-{trace_id}-{parent_id}-01",
                "X-Request-Id": "traced-1",
                "X-Task-Id": "task-7",
                "X-Workflow-Run-Id": "wf-3",
            }
            with httpx.Client(base_url=serve.url, timeout=60) as client:
                model = client.get("/v1/models", headers=headers).json()["data"][0]["id"]
                done = client.post(
                    "/v1/completions",
                    headers=headers,
                    json={"model": model, "prompt": LONG_PROMPT, "max_tokens": 4},
                )
                assert done.status_code == 200, done.text
                usage = done.json()["usage"]
                cancel_id = _cancelled_stream(client, serve, model)

            server = _server_span(rx, "traced-1")
            assert (server.trace_id, server.parent_span_id) == (trace_id, parent_id)
            assert server.service == "gateway-under-test"
            assert server.name == "POST /v1/completions"
            a = server.attributes
            assert a["fairserve.tenant_id"] and a["fairserve.task_id"] == "task-7"
            assert a["fairserve.workflow_run_id"] == "wf-3" and a["gen_ai.request.model"] == model
            assert a["fairserve.status"] == "completed"
            assert a["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
            assert a["gen_ai.usage.output_tokens"] == usage["completion_tokens"] == 4

            (admission,) = rx.named("admission", trace_id)
            assert admission.parent_span_id == server.span_id
            assert admission.attributes["fairserve.admission.decision"] == "admitted"

            engine_spans = _engine_spans(rx, server, ("engine.queue", "engine.prefill", "engine.decode"))
            for span in engine_spans.values():
                assert span.parent_span_id == server.span_id and span.service == "fairserve-engine"
                assert (
                    span.attributes["fairserve.request_id"] != "traced-1"
                )  # the engine's own id, not the caller's
            chunks = [e for name, e in engine_spans["engine.prefill"].events if name == "prefill.chunk"]
            assert len(chunks) >= 2, chunks
            prefilled = sum(e["fairserve.chunk.tokens"] for e in chunks)
            assert (
                prefilled
                == usage["prompt_tokens"]
                - engine_spans["engine.prefill"].attributes["fairserve.cached_tokens"]
            )
            assert engine_spans["engine.decode"].attributes["fairserve.completion_tokens"] == 4
            assert "engine.cancel" not in {s.name for s in rx.spans if s.trace_id == trace_id}

            cancelled = _server_span(rx, cancel_id)
            assert cancelled.attributes["fairserve.status"] == "cancelled"
            assert any(name == "cancelled" for name, _ in cancelled.events)
            (cancel,) = _engine_spans(rx, cancelled, ("engine.cancel",)).values()
            assert cancel.parent_span_id == cancelled.span_id
            assert cancel.attributes["fairserve.cancel_state"]
            assert rx.content_types == {"application/x-protobuf"}
        finally:
            if serve is not None:
                serve.stop()
            engine.stop()


def _cancelled_stream(client: httpx.Client, serve: ServeProcess, model: str) -> str:
    """A long stream cancelled by its id once its first token arrived (no traceparent: the gateway's own trace)."""
    request_id = "traced-cancel"
    headers = {**serve.headers(serve.banner["api_key"]), "X-Request-Id": request_id}
    body = {"model": model, "prompt": "count", "max_tokens": 2000, "stream": True}
    with client.stream("POST", "/v1/completions", headers=headers, json=body) as stream:
        lines = stream.iter_lines()
        next(line for line in lines if line.startswith("data: "))
        cancel = client.post(f"/v1/requests/{request_id}/cancel", headers=headers)
        assert cancel.status_code == 200, cancel.text
        for _ in lines:  # to the end of the stream
            pass
    return request_id


def test_sampling_and_a_callers_sampled_flag_with_the_local_worker(tmp_path: Path) -> None:
    """`--trace-sample-ratio 0` traces nothing of its own, but a caller's sampled trace is followed, into
    `serve`'s own engine worker process (the traceparent crosses its ipc socket inside Submit)."""
    with otlp_receiver() as rx:
        serve = ServeProcess(tmp_path, "--otlp-endpoint", rx.endpoint, "--trace-sample-ratio", "0")
        try:
            key = serve.banner["api_key"]
            with httpx.Client(base_url=serve.url, timeout=60) as client:
                model = client.get("/v1/models", headers=serve.headers(key)).json()["data"][0]["id"]
                body = {"model": model, "prompt": "hello", "max_tokens": 2}
                plain = client.post(
                    "/v1/completions",
                    headers=serve.headers(key, **{"X-Request-Id": "unsampled-1"}),
                    json=body,
                )
                assert plain.status_code == 200, plain.text
                trace_id, parent_id = _caller()
                followed = client.post(
                    "/v1/completions",
                    headers=serve.headers(
                        key, **{"X-Request-Id": "followed-1", "traceparent": f"00-{trace_id}-{parent_id}-01"}
                    ),
                    json=body,
                )
                assert followed.status_code == 200, followed.text
            server = _server_span(rx, "followed-1")
            assert server.trace_id == trace_id and server.service == "fairserve-gateway"
            spans = _engine_spans(rx, server, ("engine.queue", "engine.prefill", "engine.decode"))
            assert all(s.parent_span_id == server.span_id for s in spans.values())
            with rx.lock:
                assert not [s for s in rx.spans if s.attributes.get("fairserve.request_id") == "unsampled-1"]
        finally:
            serve.stop()


def test_the_endpoint_comes_from_the_flag_then_the_standard_variables() -> None:
    assert traces_endpoint(None, {}) is None  # nothing configured: tracing off
    assert traces_endpoint("http://c:4318", {}) == "http://c:4318/v1/traces"
    assert traces_endpoint("http://c:4318/v1/traces", {}) == "http://c:4318/v1/traces"
    assert (
        traces_endpoint(None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"}) == "http://c:4318/v1/traces"
    )
    both = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:9/x",
    }
    assert traces_endpoint(None, both) == "http://t:9/x"
    assert traces_endpoint("http://c:4318", {**both, "OTEL_SDK_DISABLED": "true"}) is None
