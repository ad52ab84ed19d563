"""The simulator's HTTP face: vLLM's OpenAI routes, its Prometheus names, and /sim/* for tests.

Every response is written by `EngineResponse`, which watches the connection for the client's disconnect
while it waits on the engine and aborts the engine request when it comes, as vLLM does. Starlette's own
StreamingResponse notices a disconnect only on its next send under ASGI 2.4, which would leave an aborted
request in the batch until its next token.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from bench.vllm_sim.core import LETTERS, BatchEngine, SimRequest, State
from bench.vllm_sim.protocol import Ask, BadRequest, Kind, Writer, error_body, parse


@dataclass(frozen=True)
class SimConfig:
    """What the simulated deployment is: one served model, its batch, its step time, what it exposes."""

    model: str = "sim"
    slots: int = 8  # vLLM's max_num_seqs
    step_s: float = 0.01  # one decode step of the whole batch
    max_model_len: int = 4096
    kv_tokens: int = 65536  # the KV budget that vllm:kv_cache_usage_perc is a share of
    metrics: bool = True  # False: /metrics is 404, as on an engine that has none


class EngineMetrics(Collector):
    """vLLM's metric names, read from the engine at scrape time (labels as vLLM v1 sets them)."""

    def __init__(self, engine: BatchEngine, model: str) -> None:
        self.engine, self.labels = engine, {"model_name": model, "engine": "0"}

    def collect(self) -> Iterator[Metric]:
        e, names, values = self.engine, list(self.labels), list(self.labels.values())
        for name, value, doc in (
            ("vllm:num_requests_running", len(e.running), "Number of requests in model execution batches."),
            ("vllm:num_requests_waiting", len(e.waiting), "Number of requests waiting to be processed."),
            ("vllm:kv_cache_usage_perc", e.kv_usage(), "KV-cache usage. 1 means 100 percent usage."),
        ):
            gauge = GaugeMetricFamily(name, doc, labels=names)
            gauge.add_metric(values, value)
            yield gauge
        for name, value, doc in (
            ("vllm:prompt_tokens", e.totals.prompt_tokens, "Number of prefill tokens processed."),
            ("vllm:generation_tokens", e.totals.generation_tokens, "Number of generation tokens processed."),
        ):
            counter = CounterMetricFamily(name, doc, labels=names)
            counter.add_metric(values, value)
            yield counter
        success = CounterMetricFamily(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels=[*names, "finished_reason"],
        )
        success.add_metric([*values, "length"], e.totals.finished)
        success.add_metric([*values, "abort"], e.totals.aborted)
        yield success


class EngineResponse(Response):
    """Submit on the first send, then stream or wait, aborting the engine request on a disconnect."""

    def __init__(self, engine: BatchEngine, ask: Ask, request_id: str) -> None:
        super().__init__()
        self.engine, self.ask, self.request_id = engine, ask, request_id

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        req = self.engine.submit(self.ask.prompt_tokens, self.ask.max_tokens, self.request_id)
        writer = Writer(self.ask, req.request_id)
        body = self._stream(req, writer) if self.ask.stream else self._whole(req, writer)
        pump = asyncio.ensure_future(self._pump(body, send))
        watch = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait({pump, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.engine.abort(req)  # a no-op once it finished
            for task in (pump, watch):
                task.cancel()
            await asyncio.gather(pump, watch, return_exceptions=True)
        if pump.done() and not pump.cancelled() and (exc := pump.exception()) is not None:
            raise exc

    async def _pump(self, body: AsyncIterator[bytes], send: Send) -> None:
        started = False

        async def start() -> None:
            kind = b"text/event-stream" if self.ask.stream else b"application/json"
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", kind)]})

        if self.ask.stream:  # a stream's headers go at once, as Starlette's StreamingResponse sends vLLM's
            await start()
            started = True
        async for part in body:
            if not started:
                await start()
                started = True
            await send({"type": "http.response.body", "body": part, "more_body": True})
        if started:
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _stream(self, req: SimRequest, writer: Writer) -> AsyncIterator[bytes]:
        while (index := await req.outbox.get()) is not None:
            if index == 0 and self.ask.kind == "chat":  # vLLM sends the role with the first output
                yield writer.chunk(None, None, 0, role=True)
            last = index + 1 == req.max_tokens
            yield writer.chunk(LETTERS[index % len(LETTERS)], "length" if last else None, index + 1)
        if req.state is State.ABORTED:
            return  # the server is stopping: the stream breaks off without [DONE]
        if self.ask.include_usage:
            yield writer.final_usage(req.completion_tokens)
        yield b"data: [DONE]\n\n"

    async def _whole(self, req: SimRequest, writer: Writer) -> AsyncIterator[bytes]:
        text = []
        while (index := await req.outbox.get()) is not None:
            text.append(LETTERS[index % len(LETTERS)])
        if req.state is State.FINISHED:
            yield json.dumps(writer.whole("".join(text), "length", req.completion_tokens)).encode()


async def _disconnected(receive: Receive) -> None:
    """Return when the client has gone (the request body was read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def create_app(config: SimConfig) -> Starlette:
    """The simulator as an ASGI app; its engine steps while the app's lifespan runs."""
    engine = BatchEngine(config.slots, config.step_s, config.kv_tokens)
    registry = CollectorRegistry(auto_describe=True)
    registry.register(EngineMetrics(engine, config.model))
    faults = {"fail_next": 0, "status": 503}

    async def generate(request: Request, kind: Kind) -> Response:
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return JSONResponse(error_body("the body is not JSON", 400), 400)
        try:
            ask = parse(kind, body, config.model, config.max_model_len)
        except BadRequest as exc:
            return JSONResponse(error_body(str(exc), exc.status, exc.param), exc.status)
        if faults["fail_next"] > 0:
            faults["fail_next"] -= 1
            return JSONResponse(error_body("injected fault", faults["status"]), faults["status"])
        return EngineResponse(engine, ask, request.headers.get("x-request-id", ""))

    async def completions(request: Request) -> Response:
        return await generate(request, "completion")

    async def chat(request: Request) -> Response:
        return await generate(request, "chat")

    async def models(_: Request) -> Response:
        card = {"id": config.model, "object": "model", "created": 0, "owned_by": "vllm", "root": config.model}
        return JSONResponse({"object": "list", "data": [card | {"max_model_len": config.max_model_len}]})

    async def metrics(_: Request) -> Response:
        if not config.metrics:
            return Response("Not Found", 404)
        return Response(generate_latest(registry), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def health(_: Request) -> Response:
        return Response(status_code=200)

    async def requests(_: Request) -> Response:
        return JSONResponse({"requests": [r.record() for r in engine.requests.values()]})

    async def set_faults(request: Request) -> Response:
        body: dict[str, Any] = await request.json()
        faults["fail_next"] = int(body.get("fail_next", 0))
        faults["status"] = int(body.get("status", 503))
        return JSONResponse(faults)

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        engine.start()
        try:
            yield
        finally:
            await engine.stop()

    routes = [
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/models", models),
        Route("/metrics", metrics),
        Route("/health", health),
        Route("/sim/requests", requests),
        Route("/sim/faults", set_faults, methods=["POST"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.engine = engine
    return app
