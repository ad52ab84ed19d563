"""What tracing costs the gateway: tracing on at ratio 1.0 against off, alternating in one session
(`--trace-ab`).

    .venv/bin/python -m experiments.gateway_overhead --rate 100 --duration 3 --trace-ab 6

Each round runs `fairserve serve` (engine in its own process) once, streaming requests through it with
experiments.gateway_overhead's tools; the `traced` arm adds `--otlp-endpoint` (an OTLP/HTTP sink in this process
that decodes and counts what it is sent) and `--trace-sample-ratio 1`, so every request makes its server and
admission spans and the engine its own. Rounds alternate traced, plain, plain, traced, ... so the machine's
drift hits both alike; the headline is the ratio of the gateway process's CPU per request, traced / plain
(the exporter's thread included: it runs in that process).
"""

from __future__ import annotations

import argparse
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from experiments.gateway_overhead import NAN, Served
from experiments.remote_ab import alternate, served_round


class SpanSink:
    """An OTLP/HTTP endpoint that decodes each export and counts its spans."""

    def __init__(self) -> None:
        self.spans = 0
        self.lock = threading.Lock()
        self.endpoint = ""

    def take(self, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        n = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
        with self.lock:
            self.spans += n


@contextmanager
def span_sink() -> Iterator[SpanSink]:
    """A sink on a free loopback port for the life of the block."""
    sink = SpanSink()
    reply = ExportTraceServiceResponse().SerializeToString()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (the http.server protocol)
            sink.take(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    sink.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield sink
    finally:
        server.shutdown()
        server.server_close()


async def trace_round(args: argparse.Namespace, tmp: str, arm: str, index: int) -> dict[str, float]:
    """One round of an arm: `fairserve serve` with tracing on at ratio 1 (`traced`) or off (`plain`)."""
    with span_sink() as sink:
        flags = ("--otlp-endpoint", sink.endpoint, "--trace-sample-ratio", "1") if arm == "traced" else ()
        served = Served(
            str(Path(tmp) / f"{arm}-{index}"),
            "--max-num-seqs",
            str(args.max_num_seqs),
            "--engine-process",
            *flags,
        )
        result = await served_round(args, NAN, served)  # stops the server: its last spans are flushed
        with sink.lock:
            result["spans_received"] = float(sink.spans)
    return result


async def trace_ab(args: argparse.Namespace) -> dict[str, object]:
    """Tracing on (ratio 1.0) against off, alternating; the ratio traced / plain of each figure."""
    return await alternate(args, args.trace_ab, ("traced", "plain"), trace_round)
