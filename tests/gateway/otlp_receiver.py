"""A real OTLP/HTTP trace receiver for tests: a loopback HTTP server that decodes each POST /v1/traces body
as the protobuf ExportTraceServiceRequest (opentelemetry-proto) and keeps the spans, flattened."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


@dataclass
class ReceivedSpan:
    """One span as the collector got it."""

    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    kind: int


@dataclass
class Receiver:
    """The spans received so far (thread-safe), and the endpoint to send them to."""

    endpoint: str
    spans: list[ReceivedSpan] = field(default_factory=list)
    content_types: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, request: ExportTraceServiceRequest) -> None:
        found = []
        for rs in request.resource_spans:
            attrs = {a.key: _value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    found.append(
                        ReceivedSpan(
                            service=str(attrs.get("service.name", "")),
                            name=s.name,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_span_id=s.parent_span_id.hex(),
                            start_ns=s.start_time_unix_nano,
                            end_ns=s.end_time_unix_nano,
                            attributes={a.key: _value(a.value) for a in s.attributes},
                            events=[
                                (e.name, {a.key: _value(a.value) for a in e.attributes}) for e in s.events
                            ],
                            kind=s.kind,
                        )
                    )
        with self.lock:
            self.spans.extend(found)

    def named(self, name: str, trace_id: str | None = None) -> list[ReceivedSpan]:
        with self.lock:
            return [s for s in self.spans if s.name == name and (trace_id is None or s.trace_id == trace_id)]

    def wait(self, condition: Callable[[], Any], timeout_s: float = 30.0, what: str = "spans") -> Any:
        """Poll `condition` until truthy (bounded); AssertionError naming what arrived otherwise."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if value := condition():
                return value
            time.sleep(0.05)  # polling a condition, bounded by the deadline
        with self.lock:
            got = [(s.service, s.name) for s in self.spans]
        raise AssertionError(f"timed out waiting for {what}; received {got}")


@contextmanager
def otlp_receiver() -> Iterator[Receiver]:
    """A receiver on a free loopback port for the life of the block."""
    receiver: Receiver | None = None

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (the http.server protocol)
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            assert receiver is not None
            receiver.content_types.add(self.headers.get("Content-Type", ""))
            if self.path != "/v1/traces":
                self.send_response(404)
                self.end_headers()
                return
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)  # raises on anything that is not the protobuf: the export fails
            receiver.take(request)
            reply = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver = Receiver(f"http://127.0.0.1:{server.server_address[1]}")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
