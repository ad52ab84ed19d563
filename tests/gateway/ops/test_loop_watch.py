"""`--loop-debug`: a route handler that holds the event loop past the budget is logged, naming the route,
on both event loops a gateway runs on (asyncio's, and uvloop's under `fairserve serve`)."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import httpx
import pytest
import uvicorn
import uvloop
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from gateway.app import create_app
from gateway.edge.connections import server_config
from gateway.settings import GatewaySettings
from tests.gateway.conftest import Server, wait_for

SLOW_PATH = "/test/holds-the-loop"
Runner = Callable[[Coroutine[Any, Any, None]], None]


async def _holds_the_loop(request: Request) -> PlainTextResponse:
    time.sleep(0.06)  # deliberately blocking: 60 ms on the loop, three times the 20 ms budget
    return PlainTextResponse("held")


@pytest.fixture()
def debug_gateway(server: Server) -> Iterator[Callable[[Runner, bool], str]]:
    """Start a gateway on the suite's engine with the given loop runner and `loop_debug`; returns its URL."""
    stops: list[Callable[[], None]] = []

    def start(runner: Runner, debug: bool) -> str:
        settings = GatewaySettings(
            data_dir=server.state.settings.data_dir,
            port=0,
            engine=server.state.settings.engine,
            loop_debug=debug,
        )
        app = create_app(settings, server.state.engine)
        app.router.routes.append(Route(SLOW_PATH, _holds_the_loop, methods=["GET"]))
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        uv = uvicorn.Server(server_config(app, settings, log_level="warning", lifespan="on"))
        thread = threading.Thread(target=lambda: runner(uv.serve(sockets=[sock])), daemon=True)
        thread.start()
        wait_for(lambda: uv.started, 60, "uvicorn startup")

        def stop() -> None:
            uv.should_exit = True
            thread.join(30)

        stops.append(stop)
        return f"http://127.0.0.1:{sock.getsockname()[1]}"

    yield start
    for stop in stops:
        stop()


def _slow_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "asyncio" and "took" in r.getMessage()]


@pytest.mark.parametrize("runner", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])
def test_a_callback_over_the_budget_is_logged_with_its_route(
    debug_gateway: Callable[[Runner, bool], str],
    server: Server,
    runner: Runner,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="asyncio")
    url = debug_gateway(runner, True)
    with httpx.Client(base_url=url, timeout=60) as c:
        assert c.get(SLOW_PATH, headers={"X-Request-Id": "slow-1"}).text == "held"
        wait_for(
            lambda: any(SLOW_PATH in line for line in _slow_lines(caplog)), 10, "the slow callback's line"
        )
        # The generation path runs in debug mode too (its checks of thread safety included).
        body = {"model": server.model, "prompt": "hi", "max_tokens": 2}
        assert c.post("/v1/completions", json=body, headers=server.headers("alice")).status_code == 200
    line = next(line for line in _slow_lines(caplog) if SLOW_PATH in line)
    assert f"GET {SLOW_PATH} slow-1" in line  # the route and the request it served


def test_the_check_is_off_by_default(
    debug_gateway: Callable[[Runner, bool], str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="asyncio")
    url = debug_gateway(uvloop.run, False)
    with httpx.Client(base_url=url, timeout=60) as c:
        assert c.get(SLOW_PATH).text == "held"
        assert c.get("/healthz").status_code == 200  # served after the slow one: its log line would be out
    assert GatewaySettings.model_fields["loop_debug"].default is False
    assert _slow_lines(caplog) == []
